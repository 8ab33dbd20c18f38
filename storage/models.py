"""What the storefront knows of each site's Ceph cluster and of the storage it created
there. A network volume (rental.NetworkVolume, the customer's product) is backed by one
CephFS subvolume (VolumeStore); a node reaches the subvolumes of its leases with its own
cephx key (NodeStorageKey); object storage is an RGW user per customer and site
(S3Account), metered from RGW and billed per GB-month (StorageCharge rows tie each ledger
entry to its site)."""
import os

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from billing.models import OrderedVolume  # noqa: F401 - in billing.models, which the ledger reads it from


class StorageCluster(models.Model):
    """The operator's Ceph cluster at a site (one per site). The client key may be left
    blank here and given in the environment as CEPH_KEY_<SITE CODE> (e.g. CEPH_KEY_DFW_1)."""

    site = models.OneToOneField("inventory.Site", on_delete=models.PROTECT, related_name="storage_cluster")
    mon_host = models.CharField(max_length=300, help_text="Monitor addresses, as in ceph.conf's mon_host")
    client_name = models.CharField(max_length=60, default="client.storefront")
    client_key = models.CharField(max_length=100, blank=True,
                                  help_text="cephx secret of the client; blank: CEPH_KEY_<SITE> in the environment")
    fs_name = models.CharField(max_length=60, default="cephfs")
    subvolume_group = models.CharField(max_length=60, default="storefront")
    rgw_endpoint = models.CharField(max_length=200, blank=True, help_text="The S3 endpoint customers use (RGW), e.g. https://s3.dfw-1.example")
    # Observed by the storage sweep (storage.volumes.cluster_check)
    checked_at = models.DateTimeField(null=True, blank=True)
    health = models.CharField(max_length=20, blank=True)
    min_pool_size = models.PositiveSmallIntegerField(null=True, blank=True,
                                                     help_text="Smallest replica count of the volume pools")
    full = models.BooleanField(default=False)
    alert = models.CharField(max_length=300, blank=True)

    def __str__(self) -> str:
        return f"Ceph at {self.site_id}"

    def secret(self) -> str:
        return self.client_key or os.environ.get(f"CEPH_KEY_{self.site.code.upper().replace('-', '_')}", "")

    @property
    def three_replicas(self) -> bool:
        return (self.min_pool_size or 0) >= 3

    class Meta:
        db_table = "billing_storagecluster"  # the table it had as billing's model (ADR 0025)


class VolumeStore(models.Model):
    """The CephFS subvolume behind a network volume (quota = the volume's size)."""

    class State(models.TextChoices):
        READY = "ready", _("ready")
        PURGING = "purging", _("being deleted")
        PURGED = "purged", _("deleted and purged")

    volume = models.OneToOneField("rental.NetworkVolume", on_delete=models.PROTECT, related_name="store")
    subvolume = models.CharField(max_length=60, unique=True)
    path = models.CharField(max_length=300, blank=True, help_text="Its path in the CephFS")
    quota_bytes = models.BigIntegerField()
    simulated = models.BooleanField(default=False, help_text="Demo: no cluster behind it")
    state = models.CharField(max_length=10, choices=State.choices, default=State.READY, db_index=True)
    created_at = models.DateTimeField()
    purged_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    next_try_at = models.DateTimeField(null=True, blank=True, help_text="A failed purge is retried from then")

    def __str__(self) -> str:
        return self.subvolume

    class Meta:
        db_table = "billing_volumestore"  # the table it had as billing's model (ADR 0025)


class NodeStorageKey(models.Model):
    """A node's cephx identity: caps on exactly the subvolumes attached to its leases."""

    node = models.OneToOneField("inventory.Node", on_delete=models.CASCADE, related_name="storage_key")
    auth_id = models.CharField(max_length=80, unique=True)
    key = models.CharField(max_length=100, blank=True)
    granted = models.JSONField(default=list, blank=True, help_text="Subvolume names the key reaches now")
    dirty = models.BooleanField(default=True, help_text="Caps to be brought in line with the attachments")
    updated_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        db_table = "billing_nodestoragekey"  # the table it had as billing's model (ADR 0025)


class VolumeMount(models.Model):
    """A volume's mount on a lease's instance, as the node agent reports it."""

    volume = models.ForeignKey("rental.NetworkVolume", on_delete=models.CASCADE, related_name="mounts")
    lease = models.ForeignKey("rental.Lease", on_delete=models.CASCADE, related_name="volume_mounts")
    mounted = models.BooleanField(default=False)
    error = models.JSONField(null=True, blank=True)
    first_mounted_at = models.DateTimeField(null=True, blank=True)
    reported_at = models.DateTimeField()

    class Meta:
        db_table = "billing_volumemount"  # the table it had as billing's model (ADR 0025)
        constraints = [models.UniqueConstraint(fields=["volume", "lease"], name="one_mount_row_per_volume_lease")]


class S3Account(models.Model):
    """A customer's object storage at a site: one RGW user, a quota, usage metered from RGW."""

    class State(models.TextChoices):
        ACTIVE = "active", _("active")
        CLOSED = "closed", _("closed")

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="s3_accounts")
    site = models.ForeignKey("inventory.Site", on_delete=models.PROTECT, related_name="s3_accounts")
    uid = models.CharField(max_length=64, unique=True)
    quota_gb = models.PositiveIntegerField(default=1000)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    simulated = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    # Metering: GB-seconds accrued since the last charge, and when RGW was last read.
    metered_at = models.DateTimeField()
    billed_at = models.DateTimeField(help_text="Usage is billed in arrears every 30 days from here")
    bytes_stored = models.BigIntegerField(default=0)
    unbilled_byte_seconds = models.DecimalField(max_digits=30, decimal_places=0, default=0)

    class Meta:
        db_table = "billing_s3account"  # the table it had as billing's model (ADR 0025)
        constraints = [models.UniqueConstraint(fields=["customer", "site"], name="one_s3_account_per_site")]


class S3Key(models.Model):
    account = models.ForeignKey(S3Account, on_delete=models.CASCADE, related_name="keys")
    access_key = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "billing_s3key"  # the table it had as billing's model (ADR 0025)


class StorageCharge(models.Model):
    """A ledger entry that pays for storage, with its site (dashboard revenue per site)."""

    class Kind(models.TextChoices):
        VOLUME = "volume", _("network volume")
        OBJECT = "object", _("object storage")
        SNAPSHOT = "snapshot", _("snapshot")

    entry = models.OneToOneField("billing.LedgerEntry", on_delete=models.PROTECT, related_name="storage_charge")
    site = models.ForeignKey("inventory.Site", on_delete=models.PROTECT, related_name="storage_charges")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    object_id = models.PositiveIntegerField()

    class Meta:
        db_table = "billing_storagecharge"  # the table it had as billing's model (ADR 0025)


class SnapshotMeter(models.Model):
    """How far a snapshot's storage has been billed (storage.snapshot_usage): its
    deduplicated, compressed `stored_bytes` accrue per second from `accrues_from` (the copy
    proved ready, or the end of a term paid before snapshots were billed by use) until it is
    deleted, and are billed in arrears every 30 days from the balance."""

    snapshot = models.OneToOneField("rental.Snapshot", on_delete=models.PROTECT, related_name="meter")
    accrues_from = models.DateTimeField()
    billed_until = models.DateTimeField(help_text="Usage before this moment is billed")
    billed_byte_seconds = models.DecimalField(max_digits=30, decimal_places=0, default=0)
    billed_cents = models.PositiveIntegerField(default=0)
    unpaid_since = models.DateTimeField(null=True, blank=True,
                                        help_text="A bill the balance did not cover (lapsed; deleted after the grace)")
    closed_at = models.DateTimeField(null=True, blank=True, help_text="Deleted and billed to its end")

    def __str__(self) -> str:
        return f"meter of snapshot #{self.snapshot_id}"

    class Meta:
        db_table = "billing_snapshotmeter"  # the table it had as billing's model (ADR 0025)


class SnapshotUsageCharge(models.Model):
    """One billing period of one snapshot: its stored size over the seconds of the period,
    the cents charged (0 when under a cent; the fraction carries) and the ledger entry."""

    snapshot = models.ForeignKey("rental.Snapshot", on_delete=models.PROTECT, related_name="usage_charges")
    site = models.ForeignKey("inventory.Site", on_delete=models.PROTECT, related_name="+")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    stored_bytes = models.BigIntegerField()
    byte_seconds = models.DecimalField(max_digits=30, decimal_places=0)
    cents = models.PositiveIntegerField()
    entry = models.OneToOneField("billing.LedgerEntry", null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="snapshot_usage")
    created_at = models.DateTimeField()

    class Meta:
        db_table = "billing_snapshotusagecharge"  # the table it had as billing's model (ADR 0025)
        ordering = ["-period_end", "-pk"]
        constraints = [models.UniqueConstraint(fields=["snapshot", "period_start"],
                                               name="one_snapshot_charge_per_period")]

    @property
    def tb_months(self):
        from decimal import Decimal

        return self.byte_seconds / (Decimal(10 ** 12) * 30 * 24 * 3600)


class SnapshotNodeKey(models.Model):
    """An S3 key on a snapshot's RGW user for one node and one op: taking the snapshot of a
    lease's disk, or restoring it into a lease. Made when the node is first sent the op
    (fleet.desired); removed from RGW as soon as the op is no longer sent there — the copy
    proved, the attempts over, the lease ended or moved to another node, the snapshot
    deleted — so a node never keeps a key that still opens the snapshot (ADR 0010)."""

    class Purpose(models.TextChoices):
        TAKE = "take"
        RESTORE = "restore"

    snapshot = models.ForeignKey("rental.Snapshot", on_delete=models.CASCADE, related_name="node_keys")
    lease = models.ForeignKey("rental.Lease", on_delete=models.CASCADE, related_name="+")
    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="+")
    purpose = models.CharField(max_length=10, choices=Purpose.choices)
    access_key = models.CharField(max_length=40, unique=True)
    sealed_secret = models.TextField(blank=True, help_text="rental.sealing; emptied once revoked")
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_error = models.CharField(max_length=500, blank=True, help_text="Why the last removal failed (retried)")

    class Meta:
        db_table = "billing_snapshotnodekey"  # the table it had as billing's model (ADR 0025)
        constraints = [models.UniqueConstraint(fields=["snapshot", "lease", "node", "purpose"],
                                               condition=models.Q(revoked_at__isnull=True),
                                               name="one_live_snapshot_node_key")]

    def __str__(self) -> str:
        return f"{self.access_key} ({self.purpose} snapshot #{self.snapshot_id} on {self.node_id})"
