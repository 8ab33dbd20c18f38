"""Leases and their audit trail. A lease moves through the state machine in DESIGN.md;
every deadline is an indexed UTC column swept by Celery beat."""
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from . import rules
from .addresses import ssh_command


class Term(models.TextChoices):
    WEEK = "week", _("1 week (7 days)")
    MONTH = "month", _("1 month (30 days)")


TERM_LENGTH = {Term.WEEK: timedelta(days=7), Term.MONTH: timedelta(days=30)}
#: Add-ons an order may carry, whole TB up to these limits (extra NVMe: a node's 30 TB). Read
#: by the order form, the API schema and billing's validation. Snapshots are not one: they are
#: taken from a running lease and billed by the TB-month they store (storage.snapshot_usage);
#: Lease.snapshot_tb stays only for the old leases that ordered "snapshot TB" with the lease.
ADDON_LIMITS_TB = {"extra_nvme_tb": 30, "network_volume_tb": 100}
#: The retired order add-on; an order that still asks for it is refused (billing.api).
RETIRED_ADDONS = ("snapshot_tb",)


class CustomerSettings(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rental_settings")
    auto_renew = models.BooleanField(default=True, help_text="Pay renewals from balance when it covers them")
    #: The language last chosen with the site's switcher; notices and e-mails are written in it.
    language = models.CharField(max_length=10, blank=True, default="")
    #: "Your GPUs have been idle" notices (fleet.idle): the customer may turn them off.
    idle_notices = models.BooleanField(default=True, help_text="Tell me when a lease's GPUs have been idle")

    def __str__(self) -> str:
        return f"settings of {self.user}"


class Image(models.Model):
    """A machine image from the operator's list."""

    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=80)
    vendor = models.CharField(max_length=10, choices=[("nvidia", "CUDA"), ("amd", "ROCm")])
    is_active = models.BooleanField(default=True)
    # -- a template (rental.workbench): what a lease of this image starts with ----------------
    #: The registry reference the node pulls; blank: the node maps `slug` through its own
    #: [images] list (the operator's base images).
    image_ref = models.CharField(max_length=255, blank=True)
    start_command = models.TextField(blank=True, help_text="Run by /bin/sh -c beside sshd, as root, in /workspace")
    #: Container ports the template opens, e.g. [8888] (published to anyone unless the
    #: customer narrows them).
    ports = models.JSONField(default=list, blank=True)
    #: Plain variables the template sets, e.g. {"JUPYTER_PORT": "8888"}.
    env = models.JSONField(default=dict, blank=True)
    #: A secret made afresh for every lease of this template (e.g. JUPYTER_TOKEN), unless the
    #: customer gives its value; blank: none.
    generated_secret = models.CharField(max_length=128, blank=True)
    description = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["vendor", "name"]

    def __str__(self) -> str:
        return self.name


class LeaseState(models.TextChoices):
    PENDING = "pending", _("pending payment")
    PROVISIONING = "provisioning", _("provisioning")
    ACTIVE = "active", _("active")
    SUSPENDED = "suspended", _("suspended (slot held)")
    RELEASED = "released", _("released")
    WIPED = "wiped", _("wiped")
    CANCELLED = "cancelled", _("cancelled")
    FAILED = "failed", _("failed (not delivered, refunded)")


LIVE_STATES = (LeaseState.PENDING, LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED)
#: Ended after the instance was (or may have been) created on a host: its disk is wiped.
ENDED_ON_HOST = (LeaseState.RELEASED, LeaseState.CANCELLED, LeaseState.FAILED)
#: Ended leases whose local NVMe still holds data: released or failed, or cancelled after
#: provisioning started (an order cancelled unpaid never touched a disk).
WIPE_PENDING = Q(state__in=["released", "failed"]) | Q(state="cancelled", provisioning_started_at__isnull=False)


class Lease(models.Model):
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="leases")
    offer = models.ForeignKey("inventory.Offer", on_delete=models.PROTECT, related_name="leases")
    site = models.ForeignKey("inventory.Site", on_delete=models.PROTECT, related_name="leases")
    image = models.ForeignKey(Image, on_delete=models.PROTECT)
    term = models.CharField(max_length=5, choices=Term.choices)
    state = models.CharField(max_length=12, choices=LeaseState.choices, default=LeaseState.PENDING, db_index=True)
    price_cents = models.PositiveIntegerField(help_text="Locked for every term of this lease")
    extra_nvme_tb = models.PositiveSmallIntegerField(default=0)
    network_volume_tb = models.PositiveSmallIntegerField(default=0)
    #: Retired add-on (RETIRED_ADDONS): what an old lease paid for; new orders leave it 0.
    snapshot_tb = models.PositiveSmallIntegerField(default=0)
    #: The disk starts as a copy of this snapshot (restored before the instance starts).
    restore_from = models.ForeignKey("Snapshot", null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="restored_into")
    restored_at = models.DateTimeField(null=True, blank=True)
    ssh_public_key = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    # The client address the order came from (unpaid holds are counted per address).
    ordered_from = models.GenericIPAddressField(null=True, blank=True, db_index=True)
    # Deadlines (UTC, indexed for the sweeps)
    pay_by = models.DateTimeField(db_index=True, help_text="Pending: slots held until then")
    provisioning_started_at = models.DateTimeField(null=True, blank=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True, db_index=True)
    suspended_at = models.DateTimeField(null=True, blank=True, help_text="When the instance was stopped")
    hold_until = models.DateTimeField(null=True, blank=True, db_index=True)
    wipe_by = models.DateTimeField(null=True, blank=True, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Instance
    host = models.CharField(max_length=120, blank=True)
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    #: Pay this lease's renewals from the balance (None: the account's default).
    auto_renew = models.BooleanField(null=True, blank=True,
                                     help_text="Renew from balance; empty follows the account's setting")
    # -- the workbench (rental.workbench): the customer's image, variables, secrets, ports ----
    #: The customer's own image; blank: the template's (`image`).
    image_ref = models.CharField(max_length=255, blank=True)
    registry_credential = models.ForeignKey("RegistryCredential", null=True, blank=True, on_delete=models.PROTECT,
                                            related_name="leases")
    start_command = models.TextField(blank=True)
    env = models.JSONField(default=dict, blank=True, help_text="Plain variables")
    #: The secrets' values, sealed (core.sealing); their names alone in `secret_names`, so
    #: pages and the API list them without unsealing anything.
    sealed_secrets = models.TextField(blank=True)
    secret_names = models.JSONField(default=list, blank=True)
    #: [{"port": 8888, "allow": ["0.0.0.0/0", "::/0"]}]
    ports = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["customer", "-created_at"]),
            # One partial index per live state the sweeps select from, so a pass costs what
            # the due rows cost, not what the (mostly ended) table costs. (The partial index
            # on active leases replaces the (state, ends_at) one.)
            models.Index(fields=["ends_at"], condition=Q(state="active"), name="lease_active_ends_at"),
            models.Index(fields=["hold_until"], condition=Q(state="suspended"), name="lease_suspended_hold_until"),
            models.Index(fields=["provisioning_started_at"], condition=Q(state="provisioning"),
                         name="lease_provisioning_since"),
            models.Index(fields=["wipe_by"], condition=WIPE_PENDING, name="lease_wipe_pending"),
            models.Index(fields=["ended_at"], condition=Q(state__in=["released", "wiped"]),
                         name="lease_released_ended_at"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(price_cents__gt=0), name="lease_price_positive"),
            models.CheckConstraint(
                condition=~Q(state__in=["active", "suspended"]) | Q(ends_at__isnull=False),
                name="lease_running_has_end",
            ),
        ]

    def __str__(self) -> str:
        return f"Lease #{self.pk} {self.offer} ({self.state})"

    @property
    def term_length(self) -> timedelta:
        return TERM_LENGTH[Term(self.term)]

    @property
    def renewal_due_at(self):
        return self.ends_at - rules.renewal_lead() if self.ends_at else None

    @property
    def refund_until(self):
        """The first moment a refund is refused."""
        return self.created_at + rules.refund_window()

    @property
    def ssh_command(self) -> str:
        if self.state != LeaseState.ACTIVE or not self.host:
            return ""
        return ssh_command(self.host, self.ssh_port)  # "" unless both are valid

    NODE_KEY_EVENTS = ("provisioned", "connection_changed", "node_key")

    def events_of(self, *kinds: str) -> list["LeaseEvent"]:
        """The lease's events of these kinds, oldest first (LeaseEvent's ordering), filtered from
        one read of all its events: the lease page prefetches them once for all its parts."""
        return [e for e in self.events.all() if e.kind in kinds]

    def node_key_fingerprints(self) -> list[str]:
        """The signing-key fingerprints of the servers this lease's instance ran on, the
        current one last (rental.services records each when an instance becomes ready there):
        what the customer checks sanitization records against (`gpu-rent verify-record`)."""
        found: list[str] = []
        for data in (e.data for e in self.events_of(*self.NODE_KEY_EVENTS)):
            key = (data or {}).get("node_key_fingerprint") if isinstance(data, dict) else None
            if isinstance(key, str) and key:
                found = [k for k in found if k != key] + [key]
        return found


class LeaseEvent(models.Model):
    """The audit row every transition writes: who, what, when, why."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12, blank=True)
    reason = models.CharField(max_length=300, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.kind} {self.from_state}->{self.to_state}"


class DiskKey(models.Model):
    """The instance's NVMe (LUKS2) key, by reference: the secret lives on the host agent.
    Destruction is two-phase and cannot be undone; the agent's receipt is the proof."""

    class State(models.TextChoices):
        ACTIVE = "active", _("active")
        DESTROY_REQUESTED = "destroy_requested", _("destroy requested")
        DESTROYED = "destroyed", _("destroyed")

    lease = models.OneToOneField(Lease, on_delete=models.PROTECT, related_name="disk_key")
    key_ref = models.CharField(max_length=64, unique=True, default=secrets.token_hex)
    state = models.CharField(max_length=20, choices=State.choices, default=State.ACTIVE, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    destroy_requested_at = models.DateTimeField(null=True, blank=True)
    destroy_requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                             on_delete=models.SET_NULL, related_name="+")
    destroy_reason = models.CharField(max_length=200, blank=True)
    destroyed_at = models.DateTimeField(null=True, blank=True)
    destruction_proof = models.TextField(blank=True, help_text="The host agent's receipt")

    def __str__(self) -> str:
        return f"key {self.key_ref[:8]}… ({self.state})"


class Notification(models.Model):
    """Outbox: one row per (lease, kind, deadline), so a reminder goes out once however
    often the sweep runs. Always shown in-app; e-mailed when the customer gave an address."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="notifications")
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=30)
    deadline = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    emailed_at = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["lease", "kind", "deadline"], name="one_notice_per_deadline")]


class ApiScope(models.TextChoices):
    """What an API token may do: read, place orders, control its instances, move money.
    Controlling instances is its own scope: a token that only places orders must not stop,
    restart or restore what is running, nor let a lease lapse."""
    READ = "read", _("read: offers, leases, invoices")
    ORDER = "order", _("order: place orders (unpaid, or paid from the balance with “pay”)")
    MANAGE = "manage", _("manage: stop, start, restart and restore instances; auto-renew")
    PAY = "pay", _("pay: pay from the balance and refund")


class ApiToken(models.Model):
    """Per-customer API token; only its SHA-256 is stored. `scopes` is space-separated."""

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    #: Teams (ADR 0017): the member who made it, acting for `customer` (the account); the
    #: token can do what its scopes AND this member's current role allow. Empty: the holder.
    member = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                               related_name="member_api_tokens")
    name = models.CharField(max_length=60)
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)
    # Tokens made before scopes existed keep doing everything they did.
    scopes = models.CharField(max_length=40, default="read order manage pay")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def scope_set(self) -> set[str]:
        return set(self.scopes.split())


class RecoveryCode(models.Model):
    """A one-time account recovery code, issued at sign-up for customers who
    have no e-mail: it resets the password. Only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="recovery_codes")
    code_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"recovery code of {self.user_id}{' (used)' if self.used_at else ''}"


class SshKey(models.Model):
    """A customer's saved SSH public key, chosen by name when ordering (the lease keeps its
    own copy, so deleting a saved key never locks anyone out of a running instance)."""

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=60)
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=80, help_text="SHA256, as `ssh-keygen -lf` prints it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["customer", "name"], name="ssh_key_name_once"),
            models.UniqueConstraint(fields=["customer", "fingerprint"], name="ssh_key_once"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


# The notifications ledger and the webhooks have their models in
# rental/notifications/models.py, loaded with these by RentalConfig.import_models.


# The storage products and the workbench's account rows have modules of their own; imported
# here so that Django registers them with the app and `rental.models` names every model.
from .storage_models import NetworkVolume, Snapshot, VolumeAttachment, snapshot_failure_text  # noqa: E402,F401
from .workbench_models import AccountVariable, RegistryCredential  # noqa: E402,F401
