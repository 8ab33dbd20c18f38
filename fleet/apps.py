from django.apps import AppConfig


class FleetConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "fleet"
    verbose_name = "Fleet (node agents)"

    def ready(self):
        from . import checks, credentials, desired_version  # noqa: F401 (checks: registers them)
        desired_version.watch()
        credentials.watch()
