"""issue 27: the ledger is the truth for revenue. What a month earned is

* what customers **spent from their balance** — every debit of the ledger whatever it buys
  (orders, renewals, storage paid from the balance, any charge a later change adds), except
  taking back a reversed payment (``clawback``: a debt, not a sale) and an operator's
  correction (``adjustment``);
* plus the invoices paid **from outside the balance** (a coin, or settled by hand), except
  the ones whose money went to the balance because their lease had ended (``late:<invoice>``:
  a deposit, spent — and counted — later);
* minus what was **given back** to balances: refunds and SLA credits.

Top-ups, late and excess payment credits are deposits, not revenue: they count when spent.
``entry_revenue_cents`` gives one entry's share, for the ledger export; ``revenue_between``
the totals, for the dashboard."""
from __future__ import annotations

from datetime import datetime

from django.db.models import CharField, Count, Exists, OuterRef, Q, Sum, Value
from django.db.models.functions import Cast, Concat

from .models import Invoice, LedgerEntry

K = LedgerEntry.Kind
#: debits that are no sale
NOT_SPENDING = (K.CLAWBACK, K.ADJUSTMENT)
#: credits that give revenue back
GIVEN_BACK = (K.REFUND, K.SLA_CREDIT)


def entry_revenue_cents(entry: LedgerEntry) -> int:
    """One ledger entry's effect on revenue (positive: earned, negative: given back)."""
    if entry.amount_cents < 0 and entry.kind not in NOT_SPENDING:
        return -entry.amount_cents
    if entry.amount_cents > 0 and entry.kind in GIVEN_BACK:
        return -entry.amount_cents
    return 0


SPENT = Q(amount_cents__lt=0) & ~Q(kind__in=NOT_SPENDING)


def revenue_between(start: datetime, end: datetime) -> dict:
    """Totals for [start, end]: ``cents`` booked (spent from balances + paid from outside),
    ``refunds_cents``, ``sla_credits_cents``, ``net_cents``, and the parts."""
    entries = LedgerEntry.objects.filter(at__gte=start, at__lte=end).aggregate(
        spent=Sum("amount_cents", filter=SPENT),
        refunds=Sum("amount_cents", filter=Q(kind=K.REFUND)), credits=Sum("amount_cents", filter=Q(kind=K.SLA_CREDIT)))
    to_balance = LedgerEntry.objects.filter(idempotency_key=OuterRef("late_key"))
    outside = (Invoice.objects.filter(state=Invoice.State.PAID, paid_at__gte=start, paid_at__lte=end)
               .exclude(kind=Invoice.Kind.TOPUP).exclude(paid_via="balance"))
    outside = outside.alias(late_key=_late_key()).exclude(Exists(to_balance)).aggregate(
        cents=Sum("amount_cents"), invoices=Count("pk"))
    spent, paid_outside = -(entries["spent"] or 0), outside["cents"] or 0
    refunds, credits = entries["refunds"] or 0, entries["credits"] or 0
    invoices = Invoice.objects.filter(state=Invoice.State.PAID, paid_at__gte=start, paid_at__lte=end).exclude(
        kind=Invoice.Kind.TOPUP).count()
    return {"cents": spent + paid_outside, "spent_from_balance_cents": spent, "paid_outside_cents": paid_outside,
            "invoices": invoices, "refunds_cents": refunds, "sla_credits_cents": credits,
            "net_cents": spent + paid_outside - refunds - credits}


def _late_key():
    return Concat(Value("late:"), Cast("pk", CharField()))
