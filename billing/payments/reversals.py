"""A payment that left the chain after it counted — the claw-back policy.

* **Reconcile, never guess.** What a quote put on the balance by itself is recomputed from
  the payments still on the chain: the settlement's payments at the locked rate, minus the
  invoice they paid, plus each extra payment's credit. The difference to what is posted is
  posted once per step (``rec:<quote>:<n>``): taken back in full — the balance may go
  negative, the customer owes it — or given back (never more than was taken) when the
  payment returns: re-mined after the reorg, or replaced by a fee bump that fills the
  settlement again. One payment on the chain, one credit in the ledger. A replacement that
  pays more than the invoice needs is an overpayment like any other: what it paid beyond
  what was taken goes to the balance (``excess:<quote>:<n>``), or past the quote's automatic
  cap to a review an operator decides — never kept silently. An excess waiting over the cap
  that the chain no longer holds closes its review (nothing to credit); one an operator
  credited is taken back like the rest, and given back when the payments return.
* **The operator is alerted:** the invoice is flagged ``payment_reversed``, a review is
  opened per reversed payment, an audit row says what was taken.
* **The lease waits for the money:** while the customer's balance is negative, the lease the
  invoice paid is suspended once ``PAYMENT_REVERSAL_GRACE_MINUTES`` have passed since the
  reversal (``sweep_reversed_payments``); the next credit (a payment, a top-up) recovers the
  debt first, and once the balance is back at zero or above the flag becomes
  ``payment_recovered`` and the lease resumes (if its term still runs).

Callers of ``quote_reconcile`` hold the quote's row lock.
"""
from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import Q, Sum

from inventory.audit import audit_record
from rental import services as rental
from rental.lifecycle import BATCH, Transition
from rental.models import LeaseEvent, LeaseState
from rental.notices import PAYMENT_REVERSED_REASON

from ..models import Account, Invoice, LatePaymentClaim, LedgerEntry, Payment, PaymentReview, Quote
from ..services import ledger_post
from . import config
from .credits import GONE_NOTE, credit_or_hold, forgiven_cents, quote_entry_keys, review_open
from .pricing import cents_at

log = logging.getLogger("billing.payments")

REVERSED_FLAG = "payment_reversed"
RECOVERED_FLAG = "payment_recovered"
SUSPEND_REASON = PAYMENT_REVERSED_REASON  # its notice says so (not "term ended unpaid")
PS = Payment.State
R = PaymentReview


def settled_note(quote: Quote) -> str:
    """The note of the invoice a quote's settlement paid (``services._settle``)."""
    return f"{quote.coin} quote #{quote.pk}"


def _paid_the_invoice(quote: Quote) -> bool:
    invoice = quote.invoice
    return invoice.state == Invoice.State.PAID and invoice.paid_via == quote.coin and invoice.note == settled_note(
        quote)


def settlement_units(payments: list[Payment]) -> int:
    """Base units of the settlement's payments still confirmed on the chain."""
    return sum(int(p.amount) for p in payments if p.in_settlement and p.state == PS.CONFIRMED)


def target_cents(quote: Quote, payments: list[Payment]) -> int:
    """What the quote should have put on the balance, from the chain as it is now."""
    target = sum(int(p.credited_cents or 0) for p in payments if p.state == PS.CONFIRMED and not p.in_settlement)
    if quote.state == Quote.State.SETTLED and any(p.in_settlement for p in payments):
        covered = cents_at(settlement_units(payments), quote.rate_usd_per_coin, quote.coin)
        target += covered - (int(quote.usd_cents) if _paid_the_invoice(quote) else 0)
    return target


def quote_reconcile(quote: Quote, now: datetime) -> int:
    """Post the difference between what the quote put on the balance and what the chain
    still justifies (see the module). Returns the cents posted (negative: taken back)."""
    payments = list(quote.payments.all())
    taken = -(LedgerEntry.objects.filter(idempotency_key__startswith=f"rec:{quote.pk}:").aggregate(
        s=Sum("amount_cents"))["s"] or 0)
    if not taken and not any(p.state in (PS.REORGED, PS.INVALID) and (p.in_settlement or p.credited_cents)
                             for p in payments) and not _excess_reviews(quote).filter(note=GONE_NOTE).exists():
        return 0  # nothing that counted left the chain, nothing is owed: the credits stand as posted
    entries = LedgerEntry.objects.filter(quote_entry_keys(quote) | _payment_reviews_credited(quote))
    posted = entries.aggregate(s=Sum("amount_cents"))["s"] or 0
    target = target_cents(quote, payments)
    if target - posted < _excess_held_cents(quote):
        _close_excess_gone(quote, now)  # what the chain still holds beyond is proposed again below
    delta = target - posted
    excess = 0
    if delta > 0:  # give back what reversals took, never more — less what an operator forgave meanwhile
        # A replacement or re-payment that filled the settlement with more than the invoice
        # needs: what it paid beyond what was taken is the customer's, like any overpayment.
        excess = max(delta - taken - _excess_held_cents(quote), 0)
        delta = min(delta, taken - forgiven_cents(quote))
    if delta:
        _post_difference(quote, payments, entries, delta, now)
    if excess:  # an excess review closed while its payments were off the chain waits again
        excess -= _reopen_excess(quote, excess, now)
    if excess:  # after what is given back: the automatic cap counts the quote's net credit
        _credit_excess(quote, excess, max(settlement_units(payments) - int(quote.amount), 0), now)
    return delta + excess


def _post_difference(quote: Quote, payments: list[Payment], entries, delta: int, now: datetime) -> None:
    step = entries.filter(idempotency_key__startswith=f"rec:{quote.pk}:").count() + 1
    customer = quote.invoice.customer
    if delta < 0:
        ledger_post(customer=customer, kind=LedgerEntry.Kind.CLAWBACK, amount_cents=delta, now=now,
                    invoice=quote.invoice, idempotency_key=f"rec:{quote.pk}:{step}", allow_negative=True,
                    memo=f"{quote.coin} quote #{quote.pk}: a payment left the chain after it counted")
        _alert(quote, payments, -delta, now)
    else:
        ledger_post(customer=customer, kind=LedgerEntry.Kind.RESTORED, amount_cents=delta, now=now,
                    invoice=quote.invoice, idempotency_key=f"rec:{quote.pk}:{step}",
                    memo=f"{quote.coin} quote #{quote.pk}: the reversed payment is back on the chain")
        _close_returned(quote, payments, now)


def _excess_reviews(quote: Quote):
    return quote.reviews.filter(kind=R.Kind.OVER_CAP, payment__isnull=True)


def _excess_held_cents(quote: Quote) -> int:
    """Settlement excess of the quote that waits for an operator, or that one closed without a
    credit: it is not proposed again. One credited is posted (``_payment_reviews_credited``);
    one closed because the chain no longer held it (``GONE_NOTE``) is proposed again when the
    chain does."""
    return _excess_reviews(quote).filter(state__in=(R.State.OPEN, R.State.CLOSED)).exclude(
        note=GONE_NOTE).aggregate(s=Sum("proposed_cents"))["s"] or 0


def _close_excess_gone(quote: Quote, now: datetime) -> None:
    """The settlement's payments left the chain: the excess its open reviews wait with is no
    longer all there, so they are closed (crediting them is refused); what the chain still
    holds beyond the invoice is proposed again (``_credit_excess``)."""
    from .credits import _decide

    for review in _excess_reviews(quote).filter(state=R.State.OPEN):
        _decide(review, R.State.CLOSED, None, now, GONE_NOTE)


def _reopen_excess(quote: Quote, cents: int, now: datetime) -> int:
    """Excess reviews closed because the chain no longer held their excess open again, as far
    as ``cents`` (the excess the chain holds again, not yet proposed) covers each in full.
    Returns the cents they propose."""
    reopened = 0
    for review in _excess_reviews(quote).filter(state=R.State.CLOSED, note=GONE_NOTE).order_by("pk"):
        if reopened + int(review.proposed_cents or 0) > cents:
            continue
        R.objects.filter(pk=review.pk, state=R.State.CLOSED).update(state=R.State.OPEN, decided_at=None, note="")
        audit_record(actor=None, action="payment_review_open", obj=review,
                     detail={"kind": review.kind, "quote": quote.pk, "note": "the payments are on the chain again"})
        reopened += int(review.proposed_cents or 0)
    return reopened


def _credit_excess(quote: Quote, cents: int, units: int, now: datetime) -> None:
    """The settlement's excess after a reversal, at the locked rate: to the balance within
    the quote's automatic cap (``excess:<quote>:<n>``), else a review for an operator."""
    step = LedgerEntry.objects.filter(idempotency_key__startswith=f"excess:{quote.pk}:").count() + 1
    held = quote.reviews.filter(kind=R.Kind.OVER_CAP, payment__isnull=True).count()
    credit_or_hold(quote, cents, now, kind=LedgerEntry.Kind.EXCESS_PAYMENT, key=f"excess:{quote.pk}:{step}",
                   memo=f"overpayment of {quote.coin} quote #{quote.pk} by the payment that replaced a reversed one",
                   payment=None, amount=units, review_key=f"{R.Kind.OVER_CAP}:quote:{quote.pk}:excess:{held + 1}")


def _payment_reviews_credited(quote: Quote) -> Q:
    """The credits operators gave for the quote's payments on review (held for want of a
    rate, over the cap, misdirected) and for its settlement's excess over the cap:
    target_cents counts the first through the payment's credited_cents and the second in
    what the settlement covers beyond the invoice, so what the quote posted counts them too."""
    credited = quote.reviews.filter(state=R.State.CREDITED).exclude(kind=R.Kind.REVERSED)
    keys = [f"review:{pk}" for pk in credited.filter(Q(payment__isnull=False) | Q(kind=R.Kind.OVER_CAP))
            .values_list("pk", flat=True)]
    return Q(idempotency_key__in=keys)


def _alert(quote: Quote, payments: list[Payment], taken: int, now: datetime) -> None:
    log.error("quote #%s: a payment left the chain after it counted; %s cents taken back", quote.pk, taken)
    for p in payments:
        if p.state in (PS.REORGED, PS.INVALID) and (p.in_settlement or p.credited_cents):
            review_open(quote=quote, payment=p, kind=R.Kind.REVERSED, amount=int(p.amount), cents=taken, now=now,
                        clawed_back=taken)
    paid = []
    if any(p.in_settlement and p.state in (PS.REORGED, PS.INVALID) for p in payments):  # it paid the invoice
        paid.append(quote.invoice_id)
    # a late payment the customer used to buy the order (late.py): that invoice waits for the money too
    paid += LatePaymentClaim.objects.filter(quote=quote).values_list("invoice_id", flat=True)
    Invoice.objects.filter(pk__in=paid).exclude(flag=REVERSED_FLAG).update(flag=REVERSED_FLAG, flagged_at=now)
    audit_record(actor=None, action="payment_reversed", obj=quote.invoice,
                 detail={"quote": quote.pk, "taken_cents": taken})


def _close_returned(quote: Quote, payments: list[Payment], now: datetime) -> None:
    """Reviews of reversed payments closed once everything taken is given back (the payment
    is back on the chain, or another filled the settlement in its place)."""
    from .credits import _decide

    still_taken = LedgerEntry.objects.filter(idempotency_key__startswith=f"rec:{quote.pk}:").aggregate(
        s=Sum("amount_cents"))["s"] or 0
    if still_taken < 0:
        return
    for review in quote.reviews.filter(kind=R.Kind.REVERSED, state=R.State.OPEN):
        _decide(review, R.State.CLOSED, None, now, "paid again on the chain; what was taken is given back")


# --- the debt and the lease ------------------------------------------------------------------

def debt_settle(*, customer_id: int, now: datetime) -> int:
    """The customer's balance is back at zero or above: their reversed invoices are
    recovered and the leases suspended for them resume. Returns how many invoices."""
    balance = Account.objects.filter(customer_id=customer_id).values_list("balance_cents", flat=True).first() or 0
    if balance < 0:
        return 0
    done = 0
    for invoice in Invoice.objects.filter(customer_id=customer_id, flag=REVERSED_FLAG):
        with transaction.atomic():
            if not Invoice.objects.filter(pk=invoice.pk, flag=REVERSED_FLAG).update(flag=RECOVERED_FLAG):
                continue
            done += 1
            audit_record(actor=None, action="payment_reversal_recovered", obj=invoice, detail={"balance": balance})
            if invoice.lease_id and _suspended_by_reversal(invoice.lease_id):
                rental.lease_resume(lease_id=invoice.lease_id, now=now, actor=None,
                                    reason="the reversed payment is paid again")
    return done


def _suspended_by_reversal(lease_id: int) -> bool:
    last = LeaseEvent.objects.filter(lease_id=lease_id).order_by("-at", "-pk").values("kind", "reason").first()
    return last is not None and last["kind"] == "suspended" and last["reason"] == SUSPEND_REASON


def sweep_reversed_payments(now: datetime, limit: int = BATCH) -> list[Transition]:
    """For ops.lifecycle.SWEEPS: debts recovered → invoices cleared, leases resumed;
    debts still owed past the grace → the lease they paid for is suspended."""
    done: list[Transition] = []
    flagged = Invoice.objects.filter(flag=REVERSED_FLAG).order_by("pk")
    # only the customers back at zero or above fill the batch: those still owing would
    # otherwise hold a recovered customer behind them for as long as they owe
    recovered = flagged.exclude(customer__billing_account__balance_cents__lt=0)
    for customer_id in sorted(set(recovered.values_list("customer_id", flat=True)[:limit])):
        if debt_settle(customer_id=customer_id, now=now):
            done.append(Transition(None, f"reversed payments of customer #{customer_id} paid again"))
    since = now - config.reversal_grace()
    due = flagged.filter(lease__state=LeaseState.ACTIVE, customer__billing_account__balance_cents__lt=0,
                         flagged_at__lte=since)
    for invoice in due[:limit]:
        assert invoice.lease_id is not None  # `due` is filtered on its lease's state
        if rental.lease_suspend(lease_id=invoice.lease_id, now=now, reason=SUSPEND_REASON, force=True):
            done.append(Transition(invoice.lease_id, f"suspended: invoice #{invoice.pk}'s payment was reversed"))
    return done
