"""Operator money actions. Both post to the ledger (never below zero, once per key) and
leave an audit row with the operator and the reason the customer will see."""
from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.utils.translation import gettext as _

from inventory.services import audit_record

from ..models import Invoice, LedgerEntry
from ..services import BillingError, ledger_post


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
def invoice_refund_to_balance(*, invoice: Invoice, actor: User, reason: str, now: datetime) -> LedgerEntry:
    """Return a paid invoice's amount to the customer's balance, once per invoice. The lease
    itself is not touched (suspend or release it from its own page if that is wanted)."""
    reason = _need_reason(reason)
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.state != Invoice.State.PAID or invoice.kind == Invoice.Kind.TOPUP:
        raise BillingError(_("Only a paid order or renewal invoice can be refunded to the balance."))
    if invoice.refunded_at:
        raise BillingError(_("Invoice #%(id)s was already refunded.") % {"id": invoice.pk})
    entry = ledger_post(customer=invoice.customer, kind=LedgerEntry.Kind.REFUND, amount_cents=invoice.amount_cents,
                        now=now, invoice=invoice, actor=actor, memo=reason,
                        idempotency_key=f"refund:invoice:{invoice.pk}")
    Invoice.objects.filter(pk=invoice.pk).update(refunded_at=now)
    audit_record(actor=actor, action="invoice_refunded", obj=invoice,
                 detail={"amount_cents": invoice.amount_cents, "reason": reason})
    return entry
