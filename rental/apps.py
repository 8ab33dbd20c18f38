from django.apps import AppConfig


class RentalConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "rental"
    verbose_name = "Leases"

    def ready(self):
        from . import signals  # noqa: F401 (connects the receivers)
        from .notifications import checks  # noqa: F401 (issue 30: registers the deploy check)
