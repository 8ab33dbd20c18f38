"""The storefront's side of the node agent (nodeagent/PROTOCOL.md): who each node is
(credential, Ed25519 key), what it last reported, the operations issued to it and the
signed evidence it sent. Written only through fleet.services / fleet.reports / fleet.instance_reports."""
from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class NodeAgent(models.Model):
    """The agent enrolled on one GPU server. The credential is stored as its SHA-256;
    reports are verified with `public_key` (raw Ed25519, base64)."""

    node = models.OneToOneField("inventory.Node", on_delete=models.CASCADE, related_name="agent")
    credential_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    public_key = models.CharField(max_length=64, blank=True)
    enrolled_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    hostname = models.CharField(max_length=120, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True, help_text="Last authenticated request")
    last_report_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_seq = models.BigIntegerField(default=0, help_text="Highest report seq the database accepted (replay guard)")
    seq_fence = models.BigIntegerField(
        default=0, help_text="Redis takes report seqs up to this one; past a Redis loss only higher ones pass")
    public_host = models.CharField(max_length=255, blank=True, help_text="Where customers reach the instances")
    gpus = models.JSONField(default=list, blank=True, help_text="GPUs as last reported (NVML)")
    gpu_library = models.CharField(max_length=10, blank=True, help_text="nvml, or none")
    boot_id = models.CharField(max_length=36, blank=True,
                               help_text="The node's kernel boot id as last reported: a new one means it rebooted")

    def __str__(self) -> str:
        return f"agent on {self.node}"


class EnrolmentCode(models.Model):
    """A one-time code an operator hands to the agent; only its SHA-256 is kept."""

    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="enrolment_codes")
    code_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]


class InstanceIntent(models.Model):
    """What the customer asked of the instance besides the lease's state: a stop, and how
    many restarts (each one a new op_id the agent treats as a restart)."""

    lease = models.OneToOneField("rental.Lease", on_delete=models.CASCADE, related_name="instance_intent")
    stopped_by_customer = models.BooleanField(default=False)
    restarts = models.PositiveIntegerField(default=0)
    changed_at = models.DateTimeField()


class IssuedOp(models.Model):
    """The operation last issued for a lease on a node. `counter` grows whenever want, disk
    or a restart changes, so an op_id is never reused and the agent's journal stays right."""

    lease = models.ForeignKey("rental.Lease", on_delete=models.CASCADE, related_name="issued_ops")
    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="issued_ops")
    want = models.CharField(max_length=10)
    disk = models.CharField(max_length=12)
    restarts = models.PositiveIntegerField(default=0)
    counter = models.PositiveIntegerField(default=1)
    op_id = models.CharField(max_length=80)
    issued_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["lease", "node"], name="one_issued_op_per_lease_node")]


class InstanceReport(models.Model):
    """A lease's instance as its node last reported it."""

    class State(models.TextChoices):
        RUNNING = "running", _("running")
        STOPPED = "stopped", _("stopped")
        ABSENT = "absent", _("absent")
        FAILED = "failed", _("failed")

    lease = models.ForeignKey("rental.Lease", on_delete=models.CASCADE, related_name="instance_reports")
    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="instance_reports")
    state = models.CharField(max_length=10, choices=State.choices)
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    op_id = models.CharField(max_length=80, blank=True)
    error = models.JSONField(null=True, blank=True)
    egress_counter = models.BigIntegerField(default=0, help_text="The instance's cumulative bytes sent")
    reported_at = models.DateTimeField()
    #: Published ports as the node reported them: {"8888": 31002} (container -> host port).
    ports = models.JSONField(null=True, blank=True)
    #: The image pull under way: {"done_bytes": …, "total_bytes": …}; null when none.
    pull = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["lease", "node"], name="one_instance_report_per_lease_node")]


class EgressMeter(models.Model):
    """Bytes a lease sent during one term, summed over its instances' counters; billed
    through billing.egress.egress_record."""

    lease = models.ForeignKey("rental.Lease", on_delete=models.CASCADE, related_name="egress_meters")
    term_start = models.DateTimeField()
    bytes_sent = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["lease", "term_start"], name="one_egress_meter_per_term")]


class Evidence(models.Model):
    """A signed record from a node (instance ready, key destroyed, disk wiped), stored
    verbatim once its signature checked out against the node's registered key."""

    class Kind(models.TextChoices):
        INSTANCE_READY = "instance_ready", _("instance ready")
        KEY_DESTROYED = "key_destroyed", _("key destroyed")
        DISK_WIPED = "disk_wiped", _("disk wiped")
        SNAPSHOT_TAKEN = "snapshot_taken", _("snapshot taken")
        SNAPSHOT_RESTORED = "snapshot_restored", _("snapshot restored")

    node = models.ForeignKey("inventory.Node", on_delete=models.PROTECT, related_name="evidence")
    lease = models.ForeignKey("rental.Lease", on_delete=models.PROTECT, related_name="evidence")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    op_id = models.CharField(max_length=80)
    at = models.DateTimeField(help_text="When the node says it happened")
    received_at = models.DateTimeField()
    record = models.JSONField(help_text="As signed, without the signature")
    #: The exact bytes the signature covers (canonical JSON), so the proof can be checked
    #: later whatever the database does to JSON numbers or key order.
    signed_text = models.TextField()
    signature = models.CharField(max_length=120)

    class Meta:
        ordering = ["-received_at", "-id"]
        verbose_name_plural = "evidence"
        constraints = [models.UniqueConstraint(fields=["node", "lease", "kind", "op_id"],
                                               name="one_evidence_per_op")]

    def __str__(self) -> str:
        return f"{self.kind} lease #{self.lease_id} from {self.node}"


class GpuTelemetryDay(models.Model):
    """One card (node, GPU index) of one lease for one UTC day: the node agent's per-minute
    samples packed into arrays of 1,440 (fleet/telemetry.py; docs/adr/0016-gpu-telemetry.md),
    and the day's Xid and ECC events. Written only by fleet.telemetry.telemetry_accept."""

    lease = models.ForeignKey("rental.Lease", on_delete=models.CASCADE, related_name="gpu_telemetry")
    node = models.ForeignKey("inventory.Node", on_delete=models.CASCADE, related_name="+")
    gpu_index = models.PositiveSmallIntegerField()
    day = models.DateField()
    samples = models.BinaryField(help_text="zlib of five arrays of 1,440: util, temperature, power, SM clock, VRAM")
    events = models.JSONField(default=list, blank=True, help_text='[[minute, "xid", code, n] | [minute, "ecc", corrected, uncorrected]]')
    minutes = models.PositiveSmallIntegerField(default=0, help_text="Minutes of the day with a sample")
    first_minute = models.SmallIntegerField(null=True, blank=True)
    last_minute = models.SmallIntegerField(null=True, blank=True)
    #: The day's last minute at or over WORKBENCH_IDLE_UTIL_PERCENT (the idle notice's clock).
    last_busy_minute = models.SmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["lease_id", "day", "node_id", "gpu_index"]
        constraints = [models.UniqueConstraint(fields=["lease", "node", "gpu_index", "day"],
                                               name="one_telemetry_row_per_lease_card_day")]
