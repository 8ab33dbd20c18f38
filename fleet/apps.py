from django.apps import AppConfig


class FleetConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "fleet"
    verbose_name = "Fleet (node agents)"

    def ready(self):
        from .desired_version import watch
        watch()
