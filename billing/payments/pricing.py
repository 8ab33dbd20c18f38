"""What a coin amount is worth: the rate a quote may lock (operator's, or the stablecoin
peg; stale rates refused) and base units → USD cents, always rounded down."""
from __future__ import annotations

import logging
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal, localcontext

from django.db import transaction
from django.utils.translation import gettext

from ..models import CoinRate
from ..services import BillingError
from . import config
from .coins.base import Coin
from .coins.rates import HttpJsonSource, Rate, RateUnavailable, is_stale, median_rate

log = logging.getLogger("billing.payments")
#: what an operator's hand-set rate is called; a fresh one is never overwritten by the feeds
MANUAL_SOURCE = "operator"


class PaymentError(BillingError):
    """A refused payment operation, with a message fit for the customer."""


def rate_for(coin: Coin, now: datetime) -> Rate:
    """The operator's rate (CoinRate), else the peg for stablecoins; stale rates refused."""
    row = CoinRate.objects.filter(coin=coin).first()
    if row is not None:
        rate = Rate(coin, row.usd_per_coin, row.source, row.set_at)
    elif coin.spec.stablecoin:
        rate = Rate(coin, config.stable_peg(coin), "peg", now)
    else:
        raise PaymentError(gettext("No %(coin)s exchange rate is set yet; please pay with another coin.") % {"coin": coin})
    if is_stale(rate, now, config.rate_max_age()):
        raise PaymentError(gettext("The %(coin)s exchange rate (set %(at)s UTC) is out of date, so we cannot quote "
                                   "in %(coin)s right now; please pay with another coin or try again later.")
                           % {"coin": coin, "at": f"{rate.at:%Y-%m-%d %H:%M}"})
    return rate


def fresh_rate_or_none(coin: Coin, now: datetime) -> Decimal | None:
    try:
        return rate_for(Coin(coin), now).usd_per_coin
    except PaymentError:
        return None


def cents_at(base_units: int, usd_per_coin: Decimal, coin: str) -> int:
    """Base units → USD cents at ``usd_per_coin``, rounded DOWN (never over-credit)."""
    with localcontext() as ctx:
        ctx.prec = 80
        cents = Decimal(base_units) * Decimal(usd_per_coin) * 100 / Decimal(10) ** Coin(coin).decimals
        return int(cents.to_integral_value(rounding=ROUND_FLOOR))


def rates_refresh(*, coins, now: datetime) -> dict[str, str]:
    """Each coin's median over the operator's price sources (``PRICE_SOURCES``), stored as
    its rate. A fresh rate set by hand stays (manual override); stablecoins keep their peg
    unless a rate is set. Returns what happened per coin."""
    with transaction.atomic():
        sources = [HttpJsonSource(**spec) for spec in config.price_sources()]
        if not sources:
            return {}
        done = {}
        for coin in (Coin(c) for c in coins):
            if coin.spec.stablecoin:
                continue
            row = CoinRate.objects.filter(coin=coin).first()
            if row and row.source == MANUAL_SOURCE and not is_stale(
                    Rate(coin, row.usd_per_coin, row.source, row.set_at), now, config.rate_max_age()):
                done[str(coin)] = "manual rate kept"
                continue
            try:
                median = median_rate(sources, coin, now, config.rate_max_age(), config.price_sources_min())
            except RateUnavailable as exc:
                log.warning("no %s rate from the price sources: %s", coin, exc)
                done[str(coin)] = f"error: {exc}"[:300]
                continue
            value = median.rate.usd_per_coin.quantize(Decimal("0.00000001"))
            CoinRate.objects.update_or_create(coin=coin, defaults={
                "usd_per_coin": value, "source": median.rate.source, "set_at": median.rate.at})
            done[str(coin)] = f"{value} from {len(median.used)} source(s)"
        return done


def coin_rate_set(*, coin: str, usd_per_coin: Decimal, actor, now: datetime, source: str = MANUAL_SOURCE) -> CoinRate:
    """An operator sets a coin's rate (USD per whole coin); dated now, audited."""
    from inventory.audit import audit_record

    with transaction.atomic():
        try:
            coin = Coin(str(coin).upper())
        except ValueError:
            raise PaymentError(gettext("Unknown coin %(coin)r.") % {"coin": coin}) from None
        if isinstance(usd_per_coin, float) or Decimal(usd_per_coin) <= 0:
            raise PaymentError(gettext("A rate is a positive decimal number of USD per coin."))
        rate, _ = CoinRate.objects.update_or_create(coin=coin, defaults={
            "usd_per_coin": Decimal(usd_per_coin), "source": source or MANUAL_SOURCE, "set_at": now})
        audit_record(actor=actor, action="coin_rate_set", obj=rate,
                     detail={"coin": str(coin), "usd_per_coin": str(usd_per_coin), "source": rate.source})
        return rate
