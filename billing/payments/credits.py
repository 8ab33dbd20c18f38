"""Money from payments that did not pay their invoice, and money that waits for an operator.

* A late or extra payment goes to the balance on its own: at the quote's locked rate when
  it was first seen while the rate was locked (before the quote expired or settled), else
  at the rate when it confirmed (the operator's rate at that watcher pass, fresh) — so a
  quote is never a free option on the coin's price.
* A payment first seen more than ``LATE_PAYMENT_WATCH_DAYS`` after its quote closed is not
  credited by itself either: a review (``after_window``) waits for an operator.
* With no fresh rate, or past the quote's automatic cap (``PAYMENT_AUTO_CREDIT_MAX_PERCENT``
  of its USD value), nothing is credited: a ``PaymentReview`` waits for an operator
  (BTCPay's "paid late" / "paid over" marked by hand).
* A payment that leaves the chain after it counted (reorg, double-spend) flags the invoice,
  takes back what it credited as far as the balance still holds it, and opens a review.
* A payment held for an operator that leaves the chain closes its review (nothing to credit);
  confirmed again, the review opens again.

Callers hold the quote's row lock; every ledger entry and review has its own unique key,
so a repeated scan changes nothing.
"""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Q, Sum
from django.utils.translation import gettext

from inventory.audit import audit_record

from ..models import LedgerEntry, Payment, PaymentReview, Quote
from ..services import ledger_post
from . import config
from .coins.base import Coin
from .pricing import PaymentError, cents_at, fresh_rate_or_none, rate_for

R = PaymentReview


def auto_credit_cap_cents(quote: Quote) -> int:
    return int(quote.usd_cents) * config.auto_credit_max_percent() // 100


def quote_entry_keys(quote: Quote) -> Q:
    """The ledger entries a quote posted by itself: its settlement's excess (``excess:<quote>``,
    and ``excess:<quote>:<n>`` when a payment that replaced a reversed one paid more),
    each extra payment (``payment:<payment>``), and what reconciling it after a reorg took
    back or gave back (``rec:<quote>:<n>``, ``reversals``)."""
    payments = [f"payment:{pk}" for pk in quote.payments.values_list("pk", flat=True)]
    return (Q(idempotency_key=f"excess:{quote.pk}") | Q(idempotency_key__in=payments)
            | Q(idempotency_key__startswith=f"rec:{quote.pk}:") | Q(idempotency_key__startswith=f"excess:{quote.pk}:"))


def auto_credited_cents(quote: Quote) -> int:
    """What the quote has on the balance by itself now, net of what reversals took back."""
    return LedgerEntry.objects.filter(quote_entry_keys(quote)).aggregate(s=Sum("amount_cents"))["s"] or 0


def reversal_debt_cents(quote: Quote) -> int:
    """What the quote's reversals took back and no operator forgave yet."""
    taken = -(LedgerEntry.objects.filter(idempotency_key__startswith=f"rec:{quote.pk}:").aggregate(
        s=Sum("amount_cents"))["s"] or 0)
    return max(taken - forgiven_cents(quote), 0)


def forgiven_cents(quote: Quote) -> int:
    """What operators credited on the quote's reversal reviews (the debt they forgave)."""
    keys = [f"review:{pk}" for pk in quote.reviews.filter(kind=R.Kind.REVERSED, state=R.State.CREDITED)
            .values_list("pk", flat=True)]
    return LedgerEntry.objects.filter(idempotency_key__in=keys).aggregate(s=Sum("amount_cents"))["s"] or 0 if keys else 0


def payment_on_time(quote: Quote, payment: Payment) -> bool:
    """The one late/on-time test: first seen on the chain (chain time) by the quote's expiry."""
    return payment.first_seen_at <= quote.expires_at


def rate_locked_until(quote: Quote) -> datetime:
    """Payments first seen before this were sent under the quote's locked rate: its expiry,
    or its settlement if that came first (a payment after it is an extra one)."""
    if quote.settled_at and quote.settled_at < quote.expires_at:
        return quote.settled_at
    return quote.expires_at


def _closed_at(quote: Quote) -> datetime:
    """When the quote stopped waiting for money: its settlement, else its expiry."""
    return quote.settled_at or quote.expires_at


def credit_extra_payment(quote: Quote, payment: Payment, now: datetime, kind: str) -> None:
    """One confirmed payment that did not pay the invoice → the balance (once), or a review."""
    if payment.credited_cents is not None or payment.reviews.exists():
        return
    if payment.first_seen_at > _closed_at(quote) + config.late_watch():
        # long after the quote closed: nobody may expect it any more — an operator decides
        review_open(quote=quote, payment=payment, kind=R.Kind.AFTER_WINDOW, amount=int(payment.amount), cents=None,
                    now=now)
        return
    locked = payment.first_seen_at <= rate_locked_until(quote)
    rate = quote.rate_usd_per_coin if locked else fresh_rate_or_none(quote.coin, now)
    if rate is None:
        review_open(quote=quote, payment=payment, kind=R.Kind.NO_RATE, amount=int(payment.amount), cents=None,
                    now=now)
        return
    cents = cents_at(int(payment.amount), rate, quote.coin)
    memo = (f"{quote.coin} {payment.txid[:16]}…:{payment.output_index} to quote #{quote.pk} "
            f"at ${rate.normalize():f}/{quote.coin} ({'quoted' if locked else 'when confirmed'})")
    if credit_or_hold(quote, cents, now, kind=kind, key=f"payment:{payment.pk}", memo=memo, payment=payment,
                      amount=int(payment.amount)):
        Payment.objects.filter(pk=payment.pk).update(credited_cents=cents, credit_rate=rate)
        payment.credited_cents, payment.credit_rate = cents, rate
    else:  # held over the cap: the rate of the proposed credit, which an operator's credit keeps
        Payment.objects.filter(pk=payment.pk).update(credit_rate=rate)
        payment.credit_rate = rate


def credit_or_hold(quote: Quote, cents: int, now: datetime, *, kind: str, key: str, memo: str,
                   payment: Payment | None, amount: int, review_key: str | None = None) -> bool:
    """Credit ``cents`` under ``key`` unless the quote's automatic cap would be passed
    (then a review holds it). True when credited (or nothing to credit: under a cent)."""
    if cents <= 0:
        return True
    if auto_credited_cents(quote) + cents > auto_credit_cap_cents(quote):
        review_open(quote=quote, payment=payment, kind=R.Kind.OVER_CAP, amount=amount, cents=cents, now=now,
                    key=review_key)
        return False
    ledger_post(customer=quote.invoice.customer, kind=kind, amount_cents=cents, now=now, invoice=quote.invoice,
                memo=memo[:200], idempotency_key=key)
    return True


def review_open(*, quote: Quote, payment: Payment | None, kind: str, amount: int, cents: int | None,
                now: datetime, clawed_back: int = 0, key: str | None = None) -> PaymentReview:
    key = key or (f"{kind}:payment:{payment.pk}" if payment else f"{kind}:quote:{quote.pk}")
    review, created = PaymentReview.objects.get_or_create(key=key, defaults={
        "quote": quote, "payment": payment, "kind": kind, "amount": amount, "proposed_cents": cents,
        "clawed_back_cents": clawed_back, "created_at": now})
    if created:
        audit_record(actor=None, action="payment_review_open", obj=review,
                     detail={"kind": kind, "quote": quote.pk, "amount": str(amount), "proposed_cents": cents})
    return review


#: what waits for an operator on one payment of the quote's own coin; the payment must still be
#: on the chain for it to be credited
HELD_ON_A_PAYMENT = (R.Kind.NO_RATE, R.Kind.OVER_CAP, R.Kind.AFTER_WINDOW)
#: the note of such a review closed because its payment left the chain
GONE_NOTE = "the payment left the chain (reorg) before an operator decided"


def held_reviews_follow_chain(quote: Quote, now: datetime) -> None:
    """A payment held for an operator (no rate, over the cap, after the window) that left the
    chain holds nothing to credit any more: its open review is closed (crediting it is
    refused). Confirmed again (re-mined), the review opens again. One an operator already
    credited is reconciled like any credited payment (``reversals``: its ``credited_cents``)."""
    gone = (Payment.State.REORGED, Payment.State.INVALID)
    for review in quote.reviews.filter(kind__in=HELD_ON_A_PAYMENT, state=R.State.OPEN, payment__state__in=gone):
        _decide(review, R.State.CLOSED, None, now, GONE_NOTE)
    for review in quote.reviews.filter(kind__in=HELD_ON_A_PAYMENT, state=R.State.CLOSED, note=GONE_NOTE,
                                       payment__state=Payment.State.CONFIRMED):
        PaymentReview.objects.filter(pk=review.pk, state=R.State.CLOSED).update(state=R.State.OPEN, decided_at=None,
                                                                               note="")
        audit_record(actor=None, action="payment_review_open", obj=review,
                     detail={"kind": review.kind, "quote": quote.pk, "note": "the payment is mined again"})


# --- operators decide -----------------------------------------------------------------------

def payment_review_credit(*, review: PaymentReview, actor, now: datetime) -> PaymentReview:
    """Credit what the review holds: the proposed amount, or (no rate at the time) the coins
    at today's fresh rate; for a reversed payment that came back, what was taken back."""
    with transaction.atomic():
        review = PaymentReview.objects.select_for_update().select_related("quote__invoice").get(pk=review.pk)
        if review.state != R.State.OPEN:
            raise PaymentError(gettext("This review is already decided."))
        quote = review.quote
        rate: Decimal | None = None
        cents = review.proposed_cents
        coin = review.sent_coin or quote.coin  # a misdirected deposit is worth what was sent
        if cents is None:
            rate = rate_for(Coin(coin), now).usd_per_coin
            cents = cents_at(int(review.amount), rate, coin)
        if review.kind == R.Kind.REVERSED:
            # each reversed payment has its review proposing all that was taken: forgiving
            # them all forgives the debt once
            cents = min(cents, reversal_debt_cents(quote))
            if cents <= 0:
                raise PaymentError(gettext("Nothing to credit: what this reversal took back is already forgiven."))
        if cents <= 0:
            raise PaymentError(gettext("Nothing to credit: the amount is worth less than a cent."))
        ledger_post(customer=quote.invoice.customer, kind=LedgerEntry.Kind.LATE_PAYMENT, amount_cents=cents, now=now,
                    invoice=quote.invoice, actor=actor, idempotency_key=f"review:{review.pk}",
                    memo=f"{review.get_kind_display()}: quote #{quote.pk}, credited by an operator"[:200])
        if review.payment_id and review.kind != R.Kind.REVERSED:  # a proposed credit keeps its rate
            Payment.objects.filter(pk=review.payment_id).update(
                credited_cents=cents, **({"credit_rate": rate} if rate is not None else {}))
        return _decide(review, R.State.CREDITED, actor, now, f"credited {cents} cents", cents=cents)


def payment_review_close(*, review: PaymentReview, actor, now: datetime, note: str) -> PaymentReview:
    """Close without crediting (refunded on-chain, loss accepted, lease suspended ...): the
    operator says why."""
    with transaction.atomic():
        review = PaymentReview.objects.select_for_update().get(pk=review.pk)
        if review.state != R.State.OPEN:
            raise PaymentError(gettext("This review is already decided."))
        if not note.strip():
            raise PaymentError(gettext("Say why the review is closed without a credit."))
        return _decide(review, R.State.CLOSED, actor, now, note.strip())


def _decide(review: PaymentReview, state: str, actor, now: datetime, note: str, cents: int | None = None):
    PaymentReview.objects.filter(pk=review.pk).update(state=state, decided_at=now, note=note[:300],
                                                      decided_by=actor if getattr(actor, "pk", None) else None)
    review.refresh_from_db()
    audit_record(actor=actor, action=f"payment_review_{state}", obj=review,
                 detail={"kind": review.kind, "quote": review.quote_id, "note": note[:300], "cents": cents})
    return review

