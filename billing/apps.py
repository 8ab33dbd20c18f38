import importlib

from django.apps import AppConfig

# Admin modules beside admin.py (Django only autodiscovers admin.py).
EXTRA_ADMIN_MODULES = ("billing.payments.admin",)


class BillingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "billing"
    verbose_name = "Billing"

    def ready(self):
        from . import checks  # noqa: F401  (registers the deploy checks)

        for module in EXTRA_ADMIN_MODULES:
            if importlib.util.find_spec(module):
                importlib.import_module(module)
