import importlib

from django.apps import AppConfig

# Admin modules beside admin.py (Django only autodiscovers admin.py).
EXTRA_ADMIN_MODULES = ("billing.payments.admin",)


class BillingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "billing"
    verbose_name = "Billing"

    def import_models(self):
        super().import_models()
        # The storage domain's tables are billing's (app label and migrations: billing); their
        # models live in the domain's package, which billing.models does not import.
        importlib.import_module("billing.storage.models")

    def ready(self):
        from rental.storage import lease_volumes_released, snapshot_deleted

        from . import checks  # noqa: F401  (registers the deploy checks)
        from .storage.snapshots import snapshot_deleted as destroy_snapshot_key
        from .storage.volumes import lease_volumes_released as take_node_access_away

        lease_volumes_released.connect(take_node_access_away, dispatch_uid="billing.storage.lease_volumes_released")
        snapshot_deleted.connect(destroy_snapshot_key, dispatch_uid="billing.storage.snapshot_deleted")

        for module in EXTRA_ADMIN_MODULES:
            if importlib.util.find_spec(module):
                importlib.import_module(module)
