"""What we have: sites, GPU models, the offers we sell, nodes with their GPU slots.

Free stock is never typed in: a slot is free when its node takes new leases, the slot is
in service, and no open `SlotAllocation` holds it. The partial unique constraint on
`SlotAllocation` is the database's guarantee that a slot is in at most one live lease.
"""
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class Site(models.Model):
    code = models.SlugField(max_length=16, unique=True, help_text="e.g. DFW-1")
    name = models.CharField(max_length=80, help_text="City, e.g. Dallas")
    region = models.CharField(max_length=40, default="us", help_text="Snapshots restore within a region")
    infiniband = models.BooleanField(default=False, help_text="400G InfiniBand between nodes")
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return f"{self.code} {self.name}"


class Interconnect(models.Model):
    """One row of the card-to-card link table and the sharding it allows."""

    class Sharding(models.TextChoices):
        NVSWITCH = "nvswitch", _("sharded, up to 8 cards")
        FABRIC_8 = "infinity_fabric", _("sharded, 8-way only")
        NVLINK_PAIRS = "nvlink_bridge", _("sharded in pairs")
        PCIE_P2P = "pcie_p2p", _("data-parallel only")
        PCIE = "pcie", _("single card")

    slug = models.SlugField(max_length=40, unique=True)
    cards = models.CharField(max_length=120, help_text="Cards this row applies to")
    link = models.CharField(max_length=80)
    bandwidth = models.CharField(max_length=60, help_text="As published, e.g. '900 GB/s'")
    sharding = models.CharField(max_length=20, choices=Sharding.choices)
    sort = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["sort", "slug"]

    def __str__(self) -> str:
        return f"{self.link} ({self.cards})"


class GpuModel(models.Model):
    class Vendor(models.TextChoices):
        NVIDIA = "nvidia", _("NVIDIA (CUDA)")
        AMD = "amd", _("AMD (ROCm)")

    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=60)
    vendor = models.CharField(max_length=10, choices=Vendor.choices)
    vram_gb = models.PositiveIntegerField()
    memory_type = models.CharField(max_length=40, blank=True)
    memory_bandwidth_gbps = models.PositiveIntegerField(null=True, blank=True, help_text="GB/s")
    interconnect = models.ForeignKey(Interconnect, on_delete=models.PROTECT, related_name="gpu_models")
    link_description = models.CharField(max_length=80, help_text="e.g. 'NVLink 900 GB/s'")
    fp8 = models.BooleanField(default=False)
    bf16_tflops = models.PositiveIntegerField(help_text="Dense BF16 tensor TFLOPS, for run-time estimates")
    included_nvme_gb = models.PositiveIntegerField(default=500)
    notes = models.CharField(max_length=120, blank=True)
    sort = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["sort", "name"]
        constraints = [models.CheckConstraint(condition=Q(vram_gb__gt=0), name="gpu_vram_positive")]

    def __str__(self) -> str:
        return self.name


class Offer(models.Model):
    """What a customer orders: n× one GPU model, at a weekly and a monthly price."""

    slug = models.SlugField(max_length=60, unique=True)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="offers")
    gpu_count = models.PositiveSmallIntegerField(default=1)
    name = models.CharField(max_length=80, blank=True, help_text="Shown name; default 'n× model'")
    link_note = models.CharField(max_length=80, blank=True, help_text="e.g. 'NVSwitch HGX node'")
    weekly_cents = models.PositiveIntegerField()
    monthly_cents = models.PositiveIntegerField()
    vcpus = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: the node's share per GPU")
    ram_gb = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: the node's share per GPU")
    network_gbps = models.PositiveIntegerField(null=True, blank=True, help_text="Public network per instance")
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["gpu_model__sort", "gpu_count", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(gpu_count__gte=1, gpu_count__lte=8), name="offer_1_to_8_gpus"),
            models.CheckConstraint(condition=Q(weekly_cents__gt=0, monthly_cents__gt=0), name="offer_prices_positive"),
        ]

    def __str__(self) -> str:
        return self.display_name

    @property
    def display_name(self) -> str:
        return self.name or (
            self.gpu_model.name if self.gpu_count == 1 else f"{self.gpu_count}× {self.gpu_model.name}"
        )

    @property
    def per_vram_gb_month_cents(self) -> int:
        """Monthly price per GB of VRAM, the fair comparison across card sizes."""
        return round(self.monthly_cents / (self.gpu_model.vram_gb * self.gpu_count))

    @property
    def per_gpu_hour_cents(self) -> int:
        """Monthly price / 720 hours / GPUs — for comparison only, nothing is sold hourly."""
        return round(self.monthly_cents / 720 / self.gpu_count)


class Node(models.Model):
    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="nodes")
    name = models.CharField(max_length=40, unique=True)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="nodes")
    gpu_count = models.PositiveSmallIntegerField()
    vcpus = models.PositiveIntegerField()
    host_ram_gb = models.PositiveIntegerField()
    nvme_max_tb = models.PositiveSmallIntegerField(default=30, help_text="Extra local NVMe limit")
    draining = models.BooleanField(default=False, help_text="Takes no new leases")
    burn_in_required = models.BooleanField(
        default=False, help_text="Set when a node agent enrols: every card passes a burn-in before each sale")
    nvlink_reported = models.BooleanField(
        null=True, blank=True, help_text="From the node agent: every GPU reaches a peer over NVLink (blank: not reported)")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__code", "name"]
        constraints = [models.CheckConstraint(condition=Q(gpu_count__gte=1, gpu_count__lte=8), name="node_1_to_8_gpus")]

    def __str__(self) -> str:
        return self.name


class GpuSlot(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="slots")
    index = models.PositiveSmallIntegerField()
    in_service = models.BooleanField(default=True, help_text="Off while the card is down or in repair")
    # Sellable only without a burn-in due (inventory.burnin) and without a health hold: the
    # drain-rule conditions the node agent reports (fleet/conditions.py), comma-separated.
    burn_in_due = models.BooleanField(default=False)
    burn_in_passed_at = models.DateTimeField(null=True, blank=True)
    health_hold = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["node_id", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="slot_unique_index")]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class SlotAllocation(models.Model):
    """A slot held by a lease (by id: inventory does not import rental)."""

    slot = models.ForeignKey(GpuSlot, on_delete=models.PROTECT, related_name="allocations")
    lease_id = models.BigIntegerField(db_index=True)
    allocated_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["slot"], condition=Q(released_at__isnull=True), name="slot_in_one_live_lease"
            )
        ]


class StorageProduct(models.Model):
    class Kind(models.TextChoices):
        EXTRA_NVME = "extra_nvme", _("Extra local NVMe")
        NETWORK_VOLUME = "network_volume", _("Network volume")
        SNAPSHOT = "snapshot", _("Snapshot")
        EGRESS = "egress", _("Egress beyond the included allowance")

    kind = models.CharField(max_length=20, choices=Kind.choices, unique=True)
    cents_per_tb_month = models.PositiveIntegerField()
    included_tb = models.PositiveIntegerField(default=0, help_text="Included per instance-month")
    max_tb = models.PositiveIntegerField(null=True, blank=True, help_text="Limit per node, if any")
    description = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.get_kind_display()


class AuditEntry(models.Model):
    """Who changed what, when and why — for changes outside a lease's own event log."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=60)
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=40)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        # "has this already been recorded for this object" (the lifecycle's alerts, a wrong
        # token's report) is asked many times a pass: without it, a scan of all history
        indexes = [models.Index(fields=["object_id", "action"], name="audit_object_action")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.action} {self.object_type}#{self.object_id}"


# --- incidents and downtime (operations) ------------------------------------------------

class Incident(models.Model):
    """A site, node or GPU slot down (or degraded) from `starts_at` to `ends_at`. Opening
    one takes the affected slots out of stock and records Downtime for each lease on them;
    closing it ends the downtime and returns the slots it took out. Written only through
    inventory.incidents (admin or the host agent's health check)."""

    class Kind(models.TextChoices):
        DOWN = "down", _("down")
        DEGRADED = "degraded", _("degraded")

    class Source(models.TextChoices):
        OPERATOR = "operator", _("operator")
        HEALTH_CHECK = "health_check", _("health check")
        BURN_IN = "burn_in", _("burn-in")

    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.PROTECT, related_name="incidents")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.PROTECT, related_name="incidents")
    slot = models.ForeignKey(GpuSlot, null=True, blank=True, on_delete=models.PROTECT, related_name="incidents")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.DOWN)
    source = models.CharField(max_length=12, choices=Source.choices, default=Source.OPERATOR)
    starts_at = models.DateTimeField(db_index=True)
    ends_at = models.DateTimeField(null=True, blank=True, db_index=True)
    reason = models.CharField(max_length=300)
    created_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    closed_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(site__isnull=False, node__isnull=True, slot__isnull=True)
                           | Q(site__isnull=True, node__isnull=False, slot__isnull=True)
                           | Q(site__isnull=True, node__isnull=True, slot__isnull=False)),
                name="incident_exactly_one_scope"),
            models.CheckConstraint(condition=Q(ends_at__isnull=True) | Q(ends_at__gte=models.F("starts_at")),
                                   name="incident_ends_after_start"),
        ]

    def __str__(self) -> str:
        return f"Incident #{self.pk} {self.scope_label} {self.kind}"

    @property
    def scope_label(self) -> str:
        if self.slot_id:
            return f"slot {self.slot}"
        if self.node_id:
            return f"node {self.node}"
        return f"site {self.site.code if self.site_id else '?'}"


class IncidentSlot(models.Model):
    """A slot an incident covers, and whether the incident took it out of service (so
    closing returns exactly those, and only when no other open incident still covers them)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="slot_links")
    slot = models.ForeignKey(GpuSlot, on_delete=models.PROTECT, related_name="incident_links")
    took_out_of_service = models.BooleanField(default=False)
    restored_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["incident", "slot"], name="incident_slot_once")]


class Downtime(models.Model):
    """One lease's share of an incident (by lease id: inventory does not import rental).
    Ends when the incident closes or the lease is migrated off the failed hardware."""

    lease_id = models.BigIntegerField(db_index=True)
    incident = models.ForeignKey(Incident, on_delete=models.PROTECT, related_name="downtimes")
    kind = models.CharField(max_length=10, choices=Incident.Kind.choices, default=Incident.Kind.DOWN)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["starts_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["incident", "lease_id"], name="one_downtime_per_incident_lease"),
            models.CheckConstraint(condition=Q(ends_at__isnull=True) | Q(ends_at__gte=models.F("starts_at")),
                                   name="downtime_ends_after_start"),
        ]

    def __str__(self) -> str:
        return f"lease #{self.lease_id} down {self.starts_at:%Y-%m-%d %H:%M}–{self.ends_at or '…'}"


class BurnIn(models.Model):
    """One diagnostic of one GPU slot, asked of its node's agent (first sale, after a
    lease, or by an operator) and answered by a signed `burn_in` record (PROTOCOL.md).
    Written only through inventory.burnin."""

    class Reason(models.TextChoices):
        FIRST_SALE = "first_sale", _("before the first sale")
        AFTER_LEASE = "after_lease", _("after a lease")
        OPERATOR = "operator", _("operator request")
        AFTER_REBOOT = "after_reboot", _("after the node rebooted")

    class Result(models.TextChoices):
        PENDING = "", _("pending")
        PASS = "pass", _("passed")
        FAIL = "fail", _("failed")

    slot = models.ForeignKey(GpuSlot, on_delete=models.CASCADE, related_name="burn_ins")
    op_id = models.CharField(max_length=80, unique=True)
    reason = models.CharField(max_length=12, choices=Reason.choices)
    requested_at = models.DateTimeField()
    requested_by = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.CharField(max_length=4, choices=Result.choices, blank=True, default="")
    record = models.JSONField(default=dict, blank=True)
    signature = models.CharField(max_length=120, blank=True)
    signed_text = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["slot"], condition=Q(finished_at__isnull=True),
                                               name="one_pending_burn_in_per_slot")]
        indexes = [models.Index(fields=["slot", "-finished_at"], name="burn_in_slot_finished")]

    def __str__(self) -> str:
        return f"burn-in {self.op_id} ({self.get_result_display()})"
