from django.apps import AppConfig


class RentalConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "rental"
    verbose_name = "Leases"

    def ready(self):
        from . import checks, login_limits, signals  # noqa: F401 (deploy checks; receivers)
        from .notifications import checks as webhook_checks  # noqa: F401 (issue 30: the deploy check)
