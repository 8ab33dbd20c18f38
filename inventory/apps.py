from django.apps import AppConfig


class InventoryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inventory"
    verbose_name = "Inventory"

    def ready(self):
        # Saves of catalog models (admin, demo loader) invalidate the cached catalog rows.
        from django.db import transaction
        from django.db.models.signals import post_delete, post_save

        from . import models
        from .selectors import catalog_changed

        def changed(sender, **kwargs):
            transaction.on_commit(catalog_changed)

        for model in (models.Site, models.GpuModel, models.Interconnect, models.Offer, models.Node,
                      models.GpuSlot, models.SlotAllocation):
            post_save.connect(changed, sender=model, dispatch_uid=f"catalog-{model.__name__}-save")
            post_delete.connect(changed, sender=model, dispatch_uid=f"catalog-{model.__name__}-delete")
