"""Exchange rates: a provider interface, operator-set static rates and stablecoin pegs.

Rates are "USD per whole coin" as ``Decimal``, with their source and time; a quote locks
one and refuses it when stale (``is_stale`` / ``require_fresh``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Protocol, runtime_checkable

from .base import COIN_SPECS, Coin

DEFAULT_MAX_AGE = timedelta(minutes=15)


class StaleRateError(Exception):
    """The rate is older than allowed; do not quote with it."""


class RateUnavailable(LookupError):
    """The provider has no rate for this coin."""


@dataclass(frozen=True)
class Rate:
    coin: Coin
    usd_per_coin: Decimal
    source: str
    at: datetime  # timezone-aware

    def __post_init__(self):
        if isinstance(self.usd_per_coin, float):
            raise TypeError("usd_per_coin must be a Decimal, not float")
        if not isinstance(self.usd_per_coin, Decimal):
            object.__setattr__(self, "usd_per_coin", Decimal(self.usd_per_coin))
        if self.usd_per_coin <= 0:
            raise ValueError("usd_per_coin must be > 0")
        if self.at.tzinfo is None:
            raise ValueError("Rate.at must be timezone-aware")


@runtime_checkable
class RateProvider(Protocol):
    def rate(self, coin: Coin) -> Rate:
        """Current rate for ``coin``; raises ``RateUnavailable`` if none."""


def is_stale(rate: Rate, now: datetime, max_age: timedelta = DEFAULT_MAX_AGE) -> bool:
    """True when ``rate`` is older than ``max_age`` at ``now`` (or dated in the future)."""
    age = now - rate.at
    return age > max_age or age < -timedelta(minutes=1)


def require_fresh(rate: Rate, now: datetime, max_age: timedelta = DEFAULT_MAX_AGE) -> Rate:
    if is_stale(rate, now, max_age):
        raise StaleRateError(
            f"{rate.coin} rate from {rate.source} at {rate.at.isoformat()} is stale at {now.isoformat()}"
        )
    return rate


class StaticRates:
    """Operator-set rates: ``{coin: (usd_per_coin, at)}`` or ``{coin: Rate}``.

    The lead wires this to the admin-set values (each stored with its time).
    """

    def __init__(self, rates: Mapping, source: str = "operator"):
        self._rates: dict[Coin, Rate] = {}
        for coin, value in rates.items():
            c = Coin(coin)
            if isinstance(value, Rate):
                self._rates[c] = value
            else:
                usd, at = value
                self._rates[c] = Rate(c, Decimal(usd) if not isinstance(usd, float) else usd, source, at)

    def rate(self, coin: Coin) -> Rate:
        try:
            return self._rates[Coin(coin)]
        except KeyError:
            raise RateUnavailable(coin) from None


class PegRates:
    """Stablecoins at a configurable peg (default 1 USD), always current."""

    def __init__(self, pegs: Mapping | None = None, clock=None):
        self._pegs = {Coin(c): Decimal(v) for c, v in (pegs or {}).items()}
        self._clock = clock or (lambda: datetime.now(UTC))

    def rate(self, coin: Coin) -> Rate:
        c = Coin(coin)
        if not COIN_SPECS[c].stablecoin:
            raise RateUnavailable(c)
        return Rate(c, self._pegs.get(c, Decimal(1)), "peg", self._clock())


class ChainedRates:
    """First provider that has a rate wins (e.g. ``ChainedRates(PegRates(), StaticRates(...))``)."""

    def __init__(self, *providers: RateProvider):
        self._providers = providers

    def rate(self, coin: Coin) -> Rate:
        for p in self._providers:
            try:
                return p.rate(coin)
            except RateUnavailable:
                continue
        raise RateUnavailable(coin)
