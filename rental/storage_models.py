"""Storage products with their own term: network volumes, their attachments to leases, and
snapshots of lease disks (their services: rental/storage.py). Imported by rental/models.py."""
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

# --- storage products with their own term (operations) ---------------------------------

class NetworkVolume(models.Model):
    """A network volume at a site (three replicas in the region): attachable to several of
    the customer's leases at that site, billed per TB-month on its own 30-day term from the
    balance, and kept when a lease is released. Unpaid at term end it lapses (detached,
    kept 7 days), then it is deleted."""

    class State(models.TextChoices):
        ACTIVE = "active", _("active")
        LAPSED = "lapsed", _("lapsed (unpaid, detached, kept 7 days)")
        DELETED = "deleted", _("deleted")

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="network_volumes")
    site = models.ForeignKey("inventory.Site", on_delete=models.PROTECT, related_name="network_volumes")
    name = models.CharField(max_length=60)
    size_tb = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE, db_index=True)
    created_at = models.DateTimeField()
    paid_until = models.DateTimeField(db_index=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(size_tb__gte=1), name="volume_at_least_1tb")]

    def __str__(self) -> str:
        return f"volume {self.name} ({self.size_tb} TB, {self.site_id})"


class VolumeAttachment(models.Model):
    volume = models.ForeignKey(NetworkVolume, on_delete=models.CASCADE, related_name="attachments")
    lease = models.ForeignKey("rental.Lease", on_delete=models.CASCADE, related_name="volume_attachments")
    attached_at = models.DateTimeField()
    detached_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["volume", "lease"], condition=Q(detached_at__isnull=True),
                                               name="volume_attached_once_per_lease")]


#: What a failed attempt's code means, for the customer (the detail follows).
FAILURE_REASONS = {
    "snapshot_failed": _("the copy failed on the node"),
    "snapshot_timed_out": _("the node reported no progress in time"),
    "bad_desired_state": _("the node could not read the request"),
    "migration_wait_over": _("the lease had to move before the copy was ready"),
}


def snapshot_failure_text(error: dict | None) -> str:
    if not error:
        return ""
    reason = FAILURE_REASONS.get(error.get("code", ""))
    reason = str(reason) if reason else error.get("code", "")
    return f"{reason} ({error['detail']})" if error.get("detail") else reason


class Snapshot(models.Model):
    """A snapshot of a lease's local disk, restorable into a new lease anywhere in the same
    region (e.g. from an A100 to an H100); billed in arrears per TB-month of what it stores
    (`stored_bytes`, storage.snapshot_usage). `paid_until`: for snapshots taken
    before that, the end of the 30-day term paid when taken; since, the moment it was taken.

    The node agent takes it with restic into a repository of its own (an RGW
    bucket of an RGW user of its own at the lease's site), encrypted with a password only
    this row holds (sealed, core.sealing). It is `creating` until the node's signed
    `snapshot_taken` evidence arrives, `available` (ready) after. Each failed attempt (a
    named failure the node reports, or no progress for SNAPSHOT_STALLED_MINUTES) is kept in
    `error` and audited, and the next attempt (a new op_id) follows, up to
    SNAPSHOT_ATTEMPTS; then the snapshot is `failed` with that reason. Deleting it purges the RGW user and its objects and
    forgets the password (`key_destroyed_at`): nothing can read it any more."""

    class State(models.TextChoices):
        CREATING = "creating", _("being taken")
        AVAILABLE = "available", _("ready")
        FAILED = "failed", _("failed")
        LAPSED = "lapsed", _("lapsed (unpaid, kept 7 days)")
        DELETED = "deleted", _("deleted")

    class Purpose(models.TextChoices):
        CUSTOMER = "customer", _("taken by the customer")
        MIGRATION = "migration", _("taken to move the lease")    # deleted once the new node restored it

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="snapshots")
    source_lease = models.ForeignKey("rental.Lease", on_delete=models.PROTECT, related_name="snapshots")
    region = models.CharField(max_length=40)
    size_tb = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.AVAILABLE, db_index=True)
    created_at = models.DateTimeField()
    paid_until = models.DateTimeField(db_index=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # -- the copy itself -----------------------------------------------------
    site = models.ForeignKey("inventory.Site", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                             help_text="Whose RGW holds the repository")
    attempt = models.PositiveSmallIntegerField(default=1, help_text="op_id snap:<id>:<attempt>")
    rgw_uid = models.CharField(max_length=80, blank=True)
    repository = models.CharField(max_length=300, blank=True, help_text="restic repository, s3:<endpoint>/<bucket>")
    access_key = models.CharField(max_length=40, blank=True)
    sealed_secrets = models.TextField(blank=True, help_text="S3 secret and restic password, sealed")
    restic_snapshot = models.CharField(max_length=80, blank=True)
    content_bytes = models.BigIntegerField(null=True, blank=True, help_text="Bytes of the files copied")
    stored_bytes = models.BigIntegerField(null=True, blank=True, help_text="Deduplicated, compressed bytes stored")
    progress = models.JSONField(null=True, blank=True, help_text="The node's last report while it runs")
    error = models.JSONField(null=True, blank=True, help_text="The last named failure (retried by the node)")
    ready_at = models.DateTimeField(null=True, blank=True)
    key_destroyed_at = models.DateTimeField(null=True, blank=True)
    # -- attempts (rental.storage.snapshot_attempt_failed) --------------------------------
    attempt_started_at = models.DateTimeField(null=True, blank=True,
                                              help_text="When the current attempt is sent to the node")
    alive_at = models.DateTimeField(null=True, blank=True,
                                    help_text="The node's last report of progress on the current attempt")
    purpose = models.CharField(max_length=10, choices=Purpose.choices, default=Purpose.CUSTOMER)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(size_tb__gte=1), name="snapshot_at_least_1tb")]

    def __str__(self) -> str:
        return f"snapshot #{self.pk} of lease #{self.source_lease_id} ({self.size_tb} TB, {self.region})"

    @property
    def op_id(self) -> str:
        return f"snap:{self.pk}:{self.attempt}"

    @property
    def percent(self) -> float | None:
        return (self.progress or {}).get("percent")

    @property
    def failure_text(self) -> str:
        """The last failed attempt's reason, for the customer."""
        return snapshot_failure_text(self.error)

    @property
    def attempts_max(self) -> int:
        return settings.SNAPSHOT_ATTEMPTS
