"""Money. USD in integer cents; a customer's balance is an append-only ledger whose
running total is cached on Account under a row lock (never below zero)."""
from django.conf import settings
from django.db import models
from django.db.models import Q


class Account(models.Model):
    customer = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="billing_account")
    balance_cents = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(balance_cents__gte=0), name="balance_never_negative")]

    def __str__(self) -> str:
        return f"account of {self.customer}"


class LedgerEntry(models.Model):
    class Kind(models.TextChoices):
        TOPUP = "topup", "top-up"
        ORDER = "order", "order paid from balance"
        RENEWAL = "renewal", "renewal paid from balance"
        REFUND = "refund", "refund"
        SLA_CREDIT = "sla_credit", "SLA credit"
        LATE_PAYMENT = "late_payment", "late payment credited"
        EXCESS_PAYMENT = "excess_payment", "overpayment credited"
        ADJUSTMENT = "adjustment", "operator adjustment"

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    amount_cents = models.BigIntegerField(help_text="Positive credits the balance, negative debits it")
    balance_after_cents = models.BigIntegerField()
    invoice = models.ForeignKey("Invoice", null=True, blank=True, on_delete=models.PROTECT, related_name="ledger")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    memo = models.CharField(max_length=200, blank=True)
    idempotency_key = models.CharField(max_length=120, null=True, blank=True, unique=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "ledger entries"
        constraints = [models.CheckConstraint(condition=~Q(amount_cents=0), name="ledger_nonzero")]


class Invoice(models.Model):
    class Kind(models.TextChoices):
        ORDER = "order", "order"
        RENEWAL = "renewal", "renewal"
        TOPUP = "topup", "balance top-up"

    class State(models.TextChoices):
        OPEN = "open", "open"
        PAID = "paid", "paid"
        EXPIRED = "expired", "expired"
        VOID = "void", "void"

    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="invoices")
    lease = models.ForeignKey("rental.Lease", null=True, blank=True, on_delete=models.PROTECT, related_name="invoices")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN, db_index=True)
    term_start = models.DateTimeField(null=True, blank=True, help_text="Renewals: the term this pays for")
    amount_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True,
                                      help_text="Orders: the payment window that holds the slots")
    paid_at = models.DateTimeField(null=True, blank=True)
    paid_via = models.CharField(max_length=20, blank=True, help_text="balance, manual, or a coin")
    settled_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    note = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["customer", "-created_at"])]
        constraints = [
            models.CheckConstraint(condition=Q(amount_cents__gt=0), name="invoice_amount_positive"),
            models.UniqueConstraint(fields=["lease", "term_start"], condition=Q(kind="renewal"),
                                    name="one_renewal_invoice_per_term"),
            models.UniqueConstraint(fields=["lease"], condition=Q(kind="order"), name="one_order_invoice_per_lease"),
        ]

    def __str__(self) -> str:
        return f"Invoice #{self.pk} ({self.kind}, {self.state})"


class InvoiceLine(models.Model):
    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    description = models.CharField(max_length=200)
    quantity = models.PositiveIntegerField(default=1)
    unit_cents = models.PositiveIntegerField()
    amount_cents = models.PositiveIntegerField()

    class Meta:
        ordering = ["id"]
        constraints = [models.CheckConstraint(condition=Q(amount_cents=models.F("quantity") * models.F("unit_cents")),
                                              name="line_amount_is_qty_times_unit")]


class JobRun(models.Model):
    """The last run of each scheduled job, so operators see a beat that stopped."""

    name = models.CharField(max_length=60, unique=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_result = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.name
