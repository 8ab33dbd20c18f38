"""Operator money actions. Both post to the ledger (never below zero, once per key) and
leave an audit row with the operator and the reason the customer will see."""
from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.utils.translation import gettext as _

from billing.ledger import (
    BillingError,
    invoice_volume_held_cents,
    invoices_refund_claim,
    ledger_post,
)
from billing.models import Invoice, LedgerEntry
from core.money import format_usd
from inventory.audit import audit_record


def _need_reason(reason: str) -> str:
    if not reason.strip():
        raise BillingError(_("Say why: the reason is recorded and shown to the customer."))
    return reason.strip()[:200]


@transaction.atomic
def balance_adjust(*, customer: User, amount_cents: int, actor: User, reason: str, now: datetime) -> LedgerEntry:
    """Credit (positive) or debit (negative) the balance by hand; a debit never overdraws."""
    reason = _need_reason(reason)
    if amount_cents == 0:
        raise BillingError(_("An adjustment needs a non-zero amount."))
    entry = ledger_post(customer=customer, kind=LedgerEntry.Kind.ADJUSTMENT, amount_cents=amount_cents, now=now,
                        actor=actor, memo=reason)
    audit_record(actor=actor, action="balance_adjusted", obj=customer,
                 detail={"amount_cents": amount_cents, "reason": reason, "entry": entry.pk})
    return entry


@transaction.atomic
def invoice_refund_to_balance(*, invoice: Invoice, actor: User, reason: str, now: datetime,
                              cents: int | None = None) -> LedgerEntry:
    """Return what is left to refund of a paid invoice (all of it, or ``cents``) to the
    customer's balance; what any other path refunded already (the customer's "Cancel and
    refund", a failed provisioning) is not refunded again, nor the part that paid for a
    network volume created with the order (billing.ledger.refundable_cents, the one rule
    every refund path uses). The lease itself is not touched (suspend or release it from
    its own page if that is wanted)."""
    reason = _need_reason(reason)
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.state != Invoice.State.PAID or invoice.kind == Invoice.Kind.TOPUP:
        raise BillingError(_("Only a paid order or renewal invoice can be refunded to the balance."))
    if cents is not None and cents <= 0:
        raise BillingError(_("A refund must be a positive amount."))
    taken, touched = invoices_refund_claim(invoices=[invoice], now=now, cents=cents)
    if not taken:
        held = invoice_volume_held_cents(invoice)
        if held:
            raise BillingError(_("What is left of invoice #%(id)s (%(amount)s) paid for the network volume ordered "
                                 "with the lease, which exists and survives the lease: it is not refunded.")
                               % {"id": invoice.pk, "amount": format_usd(held)})
        raise BillingError(_("Invoice #%(id)s was already refunded.") % {"id": invoice.pk})
    entry = ledger_post(customer=invoice.customer, kind=LedgerEntry.Kind.REFUND, amount_cents=taken,
                        now=now, invoice=invoice, actor=actor, memo=reason,
                        idempotency_key=f"refund:invoice:{invoice.pk}={touched[0].refunded_cents}")
    audit_record(actor=actor, action="invoice_refunded", obj=invoice,
                 detail={"amount_cents": taken, "reason": reason, "refunded_cents": touched[0].refunded_cents})
    return entry
