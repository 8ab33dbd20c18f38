"""Money. USD in integer cents; a customer's balance is an append-only ledger whose
running total is cached on Account under a row lock. Spending never takes it below zero;
only taking back a payment that left the chain may (the debt is recovered from
the next credit, ``billing.payments.reversals``)."""
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class Account(models.Model):
    customer = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="billing_account")
    balance_cents = models.BigIntegerField(default=0, help_text="Negative only while a reversed payment is owed")

    def __str__(self) -> str:
        return f"account of {self.customer}"


class LedgerEntry(models.Model):
    class Kind(models.TextChoices):
        TOPUP = "topup", _("top-up")
        ORDER = "order", _("order paid from balance")
        RENEWAL = "renewal", _("renewal paid from balance")
        REFUND = "refund", _("refund")
        SLA_CREDIT = "sla_credit", _("SLA credit")
        LATE_PAYMENT = "late_payment", _("late payment credited")
        EXCESS_PAYMENT = "excess_payment", _("overpayment credited")
        ADJUSTMENT = "adjustment", _("operator adjustment")
        CLAWBACK = "clawback", _("reversed payment taken back")
        RESTORED = "restored", _("reversed payment back on chain")

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
        ORDER = "order", _("order")
        RENEWAL = "renewal", _("renewal")
        TOPUP = "topup", _("balance top-up")

    class State(models.TextChoices):
        OPEN = "open", _("open")
        PAID = "paid", _("paid")
        EXPIRED = "expired", _("expired")
        VOID = "void", _("void")

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
    refunded_at = models.DateTimeField(null=True, blank=True, help_text="Paid, then refunded to the balance")
    refunded_cents = models.PositiveIntegerField(default=0, help_text="Refunded so far, by every path together")
    settled_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    note = models.CharField(max_length=300, blank=True)
    flag = models.CharField(max_length=40, blank=True, db_index=True,
                            help_text="Set when a payment that paid it was reversed (operators decide)")
    flagged_at = models.DateTimeField(null=True, blank=True, help_text="When the payment that paid it was reversed")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["customer", "-created_at"])]
        constraints = [
            models.CheckConstraint(condition=Q(amount_cents__gt=0), name="invoice_amount_positive"),
            # One refundable amount per invoice, whichever path refunds it
            models.CheckConstraint(condition=Q(refunded_cents__lte=models.F("amount_cents")),
                                   name="invoice_refunded_at_most_once"),
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

    class Meta:
        # The operations dashboard (ops.backoffice.admin) checks this named permission.
        permissions = [("view_ops_dashboard", "Can view the operations dashboard")]

    def __str__(self) -> str:
        return self.name


class JobLock(models.Model):
    """A named lock with an expiry, for deployments without Redis (ops/lifecycle/locks.py).
    Held while `expires_at` is in the future; `token` names the holder so only it releases."""

    name = models.CharField(max_length=60, primary_key=True)
    token = models.CharField(max_length=64, blank=True)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name


# --- crypto payments -------------------------------------------------------------------
# Coin amounts are integers in the coin's base unit. Wei amounts overflow 64-bit
# integers, so they are stored as DecimalField(max_digits=40, decimal_places=0).

def base_units_field(**kwargs):
    return models.DecimalField(max_digits=40, decimal_places=0, **kwargs)


COIN_CHOICES = [(c, c) for c in ("BTC", "LTC", "ETH", "USDT", "USDC", "XMR", "SOL", "DEMO")]


class CoinRate(models.Model):
    """Operator-set exchange rate (USD per whole coin), with when it was set."""

    coin = models.CharField(max_length=5, choices=COIN_CHOICES, unique=True)
    usd_per_coin = models.DecimalField(max_digits=20, decimal_places=8)
    source = models.CharField(max_length=40, default="operator")
    set_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.coin} ${self.usd_per_coin} ({self.source}, {self.set_at:%Y-%m-%d %H:%M})"


class CoinRateGuard(models.Model):
    """The price guard of one coin (``billing.payments.pricing``): the anchor — the last rate
    a quorum of price sources or an operator set, which a rate from fewer sources must stay
    close to — and, while the sources' answers are refused, since when quoting in the coin is
    stopped, why, and the rate they proposed (for an operator to confirm by setting it)."""

    coin = models.CharField(max_length=5, choices=COIN_CHOICES, unique=True)
    anchor_usd_per_coin = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    anchor_source = models.CharField(max_length=40, blank=True)
    anchor_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="Quoting stopped since (None: quoting)")
    checked_at = models.DateTimeField(null=True, blank=True, help_text="The last refusal")
    reason = models.CharField(max_length=600, blank=True)
    proposed_usd_per_coin = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True)
    proposed_source = models.CharField(max_length=40, blank=True)

    def __str__(self) -> str:
        return f"{self.coin} price guard ({'stopped' if self.stopped_at else 'quoting'})"


class CoinWallet(models.Model):
    """Watch-only receive side of a coin: the next derivation index to hand out, and the
    highest index that has been paid (for the gap-limit warning)."""

    coin = models.CharField(max_length=5, choices=COIN_CHOICES, unique=True)
    next_index = models.PositiveIntegerField(default=0)
    highest_paid_index = models.IntegerField(default=-1)

    def __str__(self) -> str:
        return f"{self.coin} wallet (next index {self.next_index})"


class Quote(models.Model):
    class State(models.TextChoices):
        NEW = "new", _("awaiting payment")
        PROCESSING = "processing", _("seen, confirming")
        SETTLED = "settled", _("settled")
        EXPIRED = "expired", _("expired")
        INVALID = "invalid", _("invalid (double-spent or reorged away)")

    class Exception_(models.TextChoices):
        NONE = "", "—"
        PARTIAL = "paid_partial", _("paid partially")
        OVER = "paid_over", _("paid over")
        LATE = "paid_late", _("paid late")

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="quotes")
    coin = models.CharField(max_length=5, choices=COIN_CHOICES)
    address = models.CharField(max_length=120)
    derivation_index = models.IntegerField(null=True, blank=True)
    reference = models.CharField(max_length=120, blank=True, help_text="Solana Pay reference")
    amount = base_units_field(help_text="Base units due")
    usd_cents = models.PositiveIntegerField()
    rate_usd_per_coin = models.DecimalField(max_digits=20, decimal_places=8)
    rate_source = models.CharField(max_length=40)
    rate_at = models.DateTimeField()
    uri = models.CharField(max_length=400)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    state = models.CharField(max_length=12, choices=State.choices, default=State.NEW, db_index=True)
    exception = models.CharField(max_length=14, choices=Exception_.choices, default="", blank=True)
    received = base_units_field(default=0, help_text="Base units seen (any confirmations)")
    confirmed = base_units_field(default=0, help_text="Base units with enough confirmations")
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["coin", "address"], condition=~Q(coin="SOL"), name="one_quote_per_address"),
            models.UniqueConstraint(fields=["reference"], condition=Q(coin="SOL"), name="one_quote_per_sol_reference"),
        ]

    def __str__(self) -> str:
        return f"Quote #{self.pk} {self.coin} for invoice #{self.invoice_id} ({self.state})"


class Payment(models.Model):
    """A payment as the chain reports it; (coin, txid, output_index) is unique, so a
    payment seen twice — two watchers, a restart — is recorded and credited once."""

    class State(models.TextChoices):
        SEEN = "seen", _("seen")
        CONFIRMED = "confirmed", _("confirmed")
        REORGED = "reorged", _("left the chain")
        INVALID = "invalid", _("dropped (double-spent, replaced or never confirmed)")

    quote = models.ForeignKey(Quote, on_delete=models.PROTECT, related_name="payments")
    coin = models.CharField(max_length=5, choices=COIN_CHOICES)
    txid = models.CharField(max_length=128)
    output_index = models.IntegerField()
    address = models.CharField(max_length=120)
    amount = base_units_field()
    confirmations = models.IntegerField(default=0)
    block_hash = models.CharField(max_length=128, blank=True)
    block_height = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.SEEN)
    first_seen_at = models.DateTimeField(help_text="Chain time: node's mempool entry or block time")
    confirmed_at = models.DateTimeField(null=True, blank=True)
    invalid_reason = models.CharField(max_length=40, blank=True)
    credited_cents = models.BigIntegerField(null=True, blank=True,
                                            help_text="Put on the balance on its own (late or extra payment)")
    in_settlement = models.BooleanField(default=False,
                                        help_text="Counted in its quote's settlement (paid the invoice)")
    credit_rate = models.DecimalField(max_digits=20, decimal_places=8, null=True, blank=True,
                                      help_text="USD per coin it was credited at")

    class Meta:
        ordering = ["-first_seen_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["coin", "txid", "output_index"], name="payment_credited_once")]

    def __str__(self) -> str:
        return f"{self.coin} {self.txid[:12]}…:{self.output_index}"


class WatcherCursor(models.Model):
    """Where a coin's watcher left off (last block, recent hashes for reorg detection), and
    the node's health as the last pass saw it (a coin is offered only while it is healthy)."""

    coin = models.CharField(max_length=5, choices=COIN_CHOICES, unique=True)
    cursor = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)
    last_ok_at = models.DateTimeField(null=True, blank=True)
    tip_time = models.DateTimeField(null=True, blank=True, help_text="Time of the node's best block")
    scanned_to = models.DateTimeField(null=True, blank=True,
                                      help_text="Last pass that reached the node's tip: payments until then are seen")
    last_error = models.CharField(max_length=300, blank=True)


class PaymentReview(models.Model):
    """Money that waits for an operator: a late or extra payment with no fresh rate to credit
    it at, or over the automatic-credit cap of its quote (BTCPay's "paid late"/"paid over"
    marked by hand), and a payment reversed after its quote settled. One row per event
    (``key``), so a repeated scan opens it once."""

    class Kind(models.TextChoices):
        NO_RATE = "no_rate", _("paid late, no fresh rate")
        OVER_CAP = "over_cap", _("over the automatic credit cap")
        REVERSED = "reversed", _("reversed after settlement")
        MISDIRECTED = "misdirected", _("sent in another coin than quoted")
        AFTER_WINDOW = "after_window", _("paid after the late-payment window")

    class State(models.TextChoices):
        OPEN = "open", _("waiting for an operator")
        CREDITED = "credited", _("credited")
        CLOSED = "closed", _("closed without credit")

    key = models.CharField(max_length=60, unique=True)
    quote = models.ForeignKey(Quote, on_delete=models.PROTECT, related_name="reviews")
    payment = models.ForeignKey(Payment, null=True, blank=True, on_delete=models.PROTECT, related_name="reviews")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN, db_index=True)
    amount = base_units_field(help_text="Base units concerned")
    sent_coin = models.CharField(max_length=5, blank=True, help_text="Misdirected: the coin actually sent")
    txid = models.CharField(max_length=128, blank=True, help_text="Misdirected: the transaction")
    proposed_cents = models.BigIntegerField(null=True, blank=True,
                                            help_text="Credit at the rate when it confirmed (none: no fresh rate)")
    clawed_back_cents = models.BigIntegerField(default=0, help_text="Reversed: unspent credit taken back")
    created_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    note = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"review #{self.pk} {self.get_kind_display()} (quote #{self.quote_id}, {self.state})"


class LatePaymentClaim(models.Model):
    """A customer's confirmation that a late-paid quote should still buy its order: once
    per quote (the unique quote makes a double click or two tabs spend the balance once)."""

    quote = models.OneToOneField(Quote, on_delete=models.PROTECT, related_name="late_claim")
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="+",
                                help_text="The invoice paid from the balance (the original, or a new order's)")
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"late payment of quote #{self.quote_id} used for invoice #{self.invoice_id}"


# --- SLA claims (operations) -----------------------------------------------------------

class SlaClaim(models.Model):
    """A customer's claim for one lease and one calendar month (SPEC: 99.9% per instance per
    month, claimed within 30 days). The credit is computed from the downtime records; the
    ledger's idempotency key `sla:<lease>:<yyyy-mm>` makes sure a month is credited once."""

    class State(models.TextChoices):
        PENDING = "pending", _("pending")
        APPROVED = "approved", _("approved")
        DECLINED = "declined", _("declined")

    lease = models.ForeignKey("rental.Lease", on_delete=models.PROTECT, related_name="sla_claims")
    customer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="sla_claims")
    period = models.DateField(help_text="First day of the calendar month claimed (UTC)")
    message = models.TextField(blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    created_at = models.DateTimeField()
    paid_seconds = models.PositiveIntegerField(default=0, help_text="Paid time of the lease in the month")
    downtime_seconds = models.PositiveIntegerField(default=0)
    availability_pct = models.DecimalField(max_digits=7, decimal_places=4, default=100)
    credit_cents = models.PositiveIntegerField(default=0, help_text="Computed; re-computed at approval")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.CharField(max_length=300, blank=True)
    ledger_entry = models.ForeignKey(LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["lease", "period"], condition=Q(state="pending"),
                                    name="one_pending_sla_claim_per_month"),
        ]

    def __str__(self) -> str:
        return f"SLA claim #{self.pk} lease #{self.lease_id} {self.period:%Y-%m} ({self.state})"


# --- egress metering (operations) -------------------------------------------------------

class EgressUsage(models.Model):
    """TB sent by one lease during one term, as the host agent reports it (a cumulative
    counter, so it only grows). Overage beyond the included allowance is billed on the
    next renewal invoice; `billed_overage_tb` is how much of it is already invoiced."""

    lease = models.ForeignKey("rental.Lease", on_delete=models.PROTECT, related_name="egress")
    term_start = models.DateTimeField()
    tb_used = models.DecimalField(max_digits=10, decimal_places=3, default=0)
    billed_overage_tb = models.DecimalField(max_digits=10, decimal_places=2, default=0)
    reported_at = models.DateTimeField()

    class Meta:
        ordering = ["-term_start", "-id"]
        constraints = [models.UniqueConstraint(fields=["lease", "term_start"], name="one_egress_row_per_term")]

    def __str__(self) -> str:
        return f"egress lease #{self.lease_id} from {self.term_start:%Y-%m-%d}: {self.tb_used} TB"


class OrderedVolume(models.Model):
    """The order page's "network volume" add-on of one lease: created on the site's Ceph
    once the order is paid and attached to the lease (storage.orders); when the
    storage cannot create it (down, full), the add-on's part of the invoice goes back to the
    balance instead. Here beside the invoices, not in storage/models.py, because what
    it holds of an invoice is part of the refund rule every refund path shares."""

    class State(models.TextChoices):
        PENDING = "pending", _("being created")
        CREATED = "created", _("created")
        REFUNDED = "refunded", _("not created, refunded")

    lease = models.OneToOneField("rental.Lease", on_delete=models.PROTECT, related_name="ordered_volume")
    invoice = models.ForeignKey("billing.Invoice", on_delete=models.PROTECT, related_name="+")
    size_tb = models.PositiveSmallIntegerField()
    cents = models.PositiveIntegerField(help_text="The add-on's part of the order invoice")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    volume = models.OneToOneField("rental.NetworkVolume", null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="ordered_with")
    reason = models.CharField(max_length=300, blank=True, help_text="Why it was not created (for the operator)")
    created_at = models.DateTimeField()
    settled_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)

    #: the states in which its part of the invoice is held: no refund path returns it
    #: (billing.ledger.refundable_cents); once not created, ordered_volume_refund does
    HELD = (State.PENDING, State.CREATED)


# Storage on the site's Ceph cluster has its models in storage/models.py,
# loaded with these by BillingConfig.import_models (this module imports no domain).
