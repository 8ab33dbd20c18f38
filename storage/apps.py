from django.apps import AppConfig


class StorageConfig(AppConfig):
    """Volumes, snapshots and object storage on each site's Ceph cluster: an app above the
    ledger (ADR 0025). Its models keep the tables they had as billing's (``billing_*``)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "storage"
    verbose_name = "Storage"

    def ready(self):
        from billing.addons import addon_register
        from rental.storage import lease_volumes_released, snapshot_deleted

        from .orders import ORDERED_VOLUME
        from .snapshots import snapshot_deleted as destroy_snapshot_key
        from .volumes import lease_volumes_released as take_node_access_away

        # rental emits these and may not import storage (it is below): storage listens.
        lease_volumes_released.connect(take_node_access_away, dispatch_uid="storage.lease_volumes_released")
        snapshot_deleted.connect(destroy_snapshot_key, dispatch_uid="storage.snapshot_deleted")
        # billing calls the order page's volume add-on through its extension point, not by import.
        addon_register(ORDERED_VOLUME)
