"""The notifications ledger and the webhook endpoints and deliveries (see the package doc)."""
import base64
import secrets
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """Standard Webhooks' form: whsec_ + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


class Dispatch(models.Model):
    """One message to one recipient about one event of one term, at most once. `recipient`
    is the channel and address ("email:<user id>", "webhook:<endpoint id>"), `event` the
    event type, `term` what the event is about (e.g. "lease:12@2026-12-08T10:00:00+00:00")."""

    recipient = models.CharField(max_length=60)
    event = models.CharField(max_length=60)
    term = models.CharField(max_length=120)
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="+")
    lease = models.ForeignKey("rental.Lease", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "dispatches"
        constraints = [models.UniqueConstraint(fields=["recipient", "event", "term"], name="one_dispatch_per_term")]

    def __str__(self) -> str:
        return f"{self.event} → {self.recipient} ({self.term})"


class WebhookEndpoint(models.Model):
    class Scope(models.TextChoices):
        CUSTOMER = "customer", _("customer: the account's own events")
        OPERATOR = "operator", _("operator: every customer's events")

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook_endpoints")
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.CUSTOMER)
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=80, default=new_secret, help_text="Signs every delivery (HMAC-SHA256)")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["owner"], condition=Q(scope="customer"),
                                               name="one_webhook_endpoint_per_customer")]

    def __str__(self) -> str:
        return f"{self.url} ({self.scope} of {self.owner})"


class WebhookDelivery(models.Model):
    """One delivery of a dispatch (a redelivery is another one, with its own delivery id);
    its attempts follow WEBHOOK_RETRY_SECONDS."""

    class State(models.TextChoices):
        PENDING = "pending", _("pending")
        SENDING = "sending", _("sending")
        DELIVERED = "delivered", _("delivered")
        FAILED = "failed", _("failed (retries used up)")

    dispatch = models.ForeignKey(Dispatch, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    event = models.CharField(max_length=60)
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    redelivery_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["next_attempt_at"], condition=Q(state="pending"),
                                name="webhook_delivery_due")]
        constraints = [
            # The first delivery of a dispatch is the only one that is not a redelivery.
            models.UniqueConstraint(fields=["dispatch"], condition=Q(redelivery_of__isnull=True),
                                    name="one_first_delivery_per_dispatch"),
        ]

    def __str__(self) -> str:
        return f"{self.event} #{self.delivery_id} ({self.state})"
