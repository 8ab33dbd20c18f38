"""Money sent in another coin than the quote's, to the quote's address — USDC to a
USDT quote, ETH to a token quote, a token to an ETH quote. ETH, USDT and USDC share one
wallet (one address per quote), so every EVM watcher watches every EVM quote's address; what
arrives there in the wrong coin is no payment of the quote, but it is ours and the
customer's: once confirmed it opens a review (``PaymentReview.Kind.MISDIRECTED``) that the
operators credit to the balance at the sent coin's fresh rate, or close after refunding it on
chain — one click either way (``credits.payment_review_credit`` / ``payment_review_close``)."""
from __future__ import annotations

import hashlib
import logging
from datetime import datetime

from inventory.audit import audit_record

from ..models import PaymentReview, Quote
from . import config as coins_config
from .coins.base import Coin, DetectedPayment
from .credits import review_open
from .pricing import cents_at, fresh_rate_or_none

log = logging.getLogger("billing.payments")


def misdirected_report(*, coin: Coin, payment: DetectedPayment, required: int, now: datetime) -> bool:
    """A payment in ``coin`` to the address of a quote in another coin of the same wallet:
    a review once it has the coin's confirmations (once per transfer). False when the
    address is no quote's at all."""
    quote = (Quote.objects.filter(coin__in=coins_config.wallet_coins(coin), address__iexact=payment.address)
             .exclude(coin=coin).select_related("invoice").first())
    if quote is None:
        return False
    if payment.confirmations < required:
        return True  # reported once confirmed (a reorg before that leaves nothing to review)
    key = _review_key(coin, payment.txid, payment.output_index)
    existing = PaymentReview.objects.filter(key=key).first()
    if existing is not None:
        _misdirected_back(existing, now)
        return True
    rate = fresh_rate_or_none(coin, now)
    cents = cents_at(int(payment.amount), rate, coin) if rate is not None else None
    log.warning("%s %s:%d sent to %s quote #%s: no payment of it, waiting for an operator", coin, payment.txid,
                payment.output_index, quote.coin, quote.pk)
    review = review_open(quote=quote, payment=None, kind=PaymentReview.Kind.MISDIRECTED, amount=int(payment.amount),
                         cents=cents, now=now, key=key)
    PaymentReview.objects.filter(pk=review.pk).update(sent_coin=str(coin), txid=payment.txid)
    return True


#: the note of a misdirected review closed because its transfer left the chain
GONE_NOTE = "the transfer left the chain (reorg) before an operator decided"


def _review_key(coin: Coin, txid: str, n: int) -> str:
    digest = hashlib.sha256(f"{coin}:{txid}:{n}".encode()).hexdigest()[:24]
    return f"{PaymentReview.Kind.MISDIRECTED}:{coin}:{digest}"


def misdirected_gone(*, coin: Coin, keys, now: datetime) -> None:
    """Misdirected transfers that left the chain: an open review is closed (there is nothing
    to credit any more); one an operator already credited is taken back from the balance
    (it may go below zero: the customer owes it), once per time it left."""
    from django.db import transaction

    from ..models import LedgerEntry
    from ..services import ledger_post

    for txid, n in keys:
        with transaction.atomic():
            review = (PaymentReview.objects.select_for_update().select_related("quote__invoice")
                      .filter(key=_review_key(coin, txid, int(n))).first())
            if review is None:
                continue
            if review.state == PaymentReview.State.OPEN:
                PaymentReview.objects.filter(pk=review.pk).update(state=PaymentReview.State.CLOSED, decided_at=now,
                                                                  note=GONE_NOTE)
                audit_record(actor=None, action="payment_review_closed", obj=review,
                             detail={"kind": review.kind, "quote": review.quote_id, "note": GONE_NOTE})
                log.warning("%s %s:%d left the chain: misdirected review #%s closed", coin, txid, n, review.pk)
            elif review.state == PaymentReview.State.CREDITED:
                gone, back = _flips(review)
                if gone == back:
                    credited = LedgerEntry.objects.get(idempotency_key=f"review:{review.pk}").amount_cents
                    ledger_post(customer=review.quote.invoice.customer, kind=LedgerEntry.Kind.CLAWBACK,
                                amount_cents=-credited, now=now, invoice=review.quote.invoice, allow_negative=True,
                                idempotency_key=f"review-gone:{review.pk}:{gone}",
                                memo=f"misdirected {coin} {txid[:16]}… left the chain after it was credited")


def _flips(review: PaymentReview) -> tuple[int, int]:
    from ..models import LedgerEntry

    keys = LedgerEntry.objects.filter(idempotency_key__regex=rf"^review-(gone|back):{review.pk}:").values_list(
        "idempotency_key", flat=True)
    return (sum(k.startswith("review-gone:") for k in keys if k), sum(k.startswith("review-back:") for k in keys if k))


def _misdirected_back(review: PaymentReview, now: datetime) -> None:
    """The transfer is on the chain again (re-mined after the reorg): what leaving it did is
    undone — the review opens again, or what was taken back is given back."""
    from ..models import LedgerEntry
    from ..services import ledger_post

    if review.state == PaymentReview.State.CLOSED and review.note == GONE_NOTE:
        PaymentReview.objects.filter(pk=review.pk, state=PaymentReview.State.CLOSED).update(
            state=PaymentReview.State.OPEN, decided_at=None, note="")
        audit_record(actor=None, action="payment_review_open", obj=review,
                     detail={"kind": review.kind, "quote": review.quote_id, "note": "the transfer is mined again"})
    elif review.state == PaymentReview.State.CREDITED:
        gone, back = _flips(review)
        if gone > back:
            credited = LedgerEntry.objects.get(idempotency_key=f"review:{review.pk}").amount_cents
            ledger_post(customer=review.quote.invoice.customer, kind=LedgerEntry.Kind.RESTORED, amount_cents=credited, now=now,
                invoice=review.quote.invoice, idempotency_key=f"review-back:{review.pk}:{back}",
                memo=f"misdirected {review.sent_coin} {review.txid[:16]}… mined again")
