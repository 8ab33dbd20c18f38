import importlib

from django.apps import AppConfig


class RentalConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "rental"
    verbose_name = "Leases"

    def import_models(self):
        super().import_models()
        # The notifications ledger and webhooks are rental's tables (app label and migrations:
        # rental) with their models in their package, which rental.models does not import.
        importlib.import_module("rental.notifications.models")
        importlib.import_module("rental.teams.models")  # memberships and invitations (ADR 0017)
        importlib.import_module("rental.idempotency")  # the API's Idempotency-Key records (ADR 0011)

    def ready(self):
        from . import checks, signals  # noqa: F401 (deploy checks; receivers)
        from .accounts import login_limits  # noqa: F401 (its receiver)
        from .notifications import checks as webhook_checks  # noqa: F401 (the deploy check)
