"""issue 27: money sent in another coin than the quote's, to the quote's address — USDC to a
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
    digest = hashlib.sha256(f"{coin}:{payment.txid}:{payment.output_index}".encode()).hexdigest()[:24]
    key = f"{PaymentReview.Kind.MISDIRECTED}:{coin}:{digest}"
    if PaymentReview.objects.filter(key=key).exists():
        return True
    rate = fresh_rate_or_none(coin, now)
    cents = cents_at(int(payment.amount), rate, coin) if rate is not None else None
    log.warning("%s %s:%d sent to %s quote #%s: no payment of it, waiting for an operator", coin, payment.txid,
                payment.output_index, quote.coin, quote.pk)
    review = review_open(quote=quote, payment=None, kind=PaymentReview.Kind.MISDIRECTED, amount=int(payment.amount),
                         cents=cents, now=now, key=key)
    PaymentReview.objects.filter(pk=review.pk).update(sent_coin=str(coin), txid=payment.txid)
    return True
