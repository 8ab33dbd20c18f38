"""What a coin amount is worth: the rate a quote may lock (operator's, or the stablecoin
peg; stale rates refused) and base units → USD cents, always rounded down."""
from __future__ import annotations

from datetime import datetime
from decimal import ROUND_FLOOR, Decimal, localcontext

from django.utils.translation import gettext

from ..models import CoinRate
from ..services import BillingError
from . import config
from .coins.base import Coin
from .coins.rates import Rate, is_stale


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
