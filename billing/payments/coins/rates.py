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


# --- operator-configured HTTP JSON price sources ---------------------------------------------

@dataclass(frozen=True)
class HttpJsonSource:
    """One price endpoint: ``url`` and ``path`` (dots; list indexes as numbers) may contain
    ``{coin}`` / ``{coin_lower}``; ``time_path`` optionally points at the quote's own time
    (unix seconds or ISO 8601), else the time of the fetch is used."""

    name: str
    url: str
    path: str
    time_path: str = ""
    timeout: float = 5.0

    def rate(self, coin: Coin, now: datetime) -> Rate:
        import json
        import urllib.request

        fill = {"coin": str(coin), "coin_lower": str(coin).lower()}
        req = urllib.request.Request(self.url.format(**fill), headers={"Accept": "application/json",
                                                                        "User-Agent": "gpu-storefront-rates"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read(), parse_float=Decimal)
            value = Decimal(str(_walk(data, self.path.format(**fill))))
            at = _parse_time(_walk(data, self.time_path.format(**fill))) if self.time_path else now
            return Rate(coin, value, self.name, at)
        except Exception as exc:  # unreachable, not JSON, path missing, not a positive number
            raise RateUnavailable(f"{self.name}: {exc.__class__.__name__}: {exc}") from None


def _walk(data, path: str):
    for part in filter(None, path.split(".")):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def _parse_time(value) -> datetime:
    if isinstance(value, (int, float, Decimal)) or str(value).isdigit():
        return datetime.fromtimestamp(int(value), tz=UTC)
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError("a source time without a timezone")
    return parsed


@dataclass(frozen=True)
class MedianRate:
    rate: Rate
    used: tuple[str, ...]
    refused: tuple[str, ...]


def median_rate(sources, coin: Coin, now: datetime, max_age: timedelta, minimum: int = 1) -> MedianRate:
    """The median of the sources that answer with a fresh rate; fewer than ``minimum`` such
    answers → ``RateUnavailable`` (with every source's reason)."""
    fresh, refused = [], []
    for source in sources:
        try:
            rate = source.rate(coin, now)
        except RateUnavailable as exc:
            refused.append(str(exc))
            continue
        if is_stale(rate, now, max_age):
            refused.append(f"{rate.source}: stale ({rate.at.isoformat()})")
        else:
            fresh.append(rate)
    if len(fresh) < max(minimum, 1):
        raise RateUnavailable(f"{coin}: {len(fresh)} fresh source(s) of {minimum} needed; " + "; ".join(refused))
    values = sorted(r.usd_per_coin for r in fresh)
    mid = len(values) // 2
    value = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    oldest = min(r.at for r in fresh)
    label = "median:" + ",".join(r.source for r in fresh)
    return MedianRate(Rate(coin, value, label[:40], oldest), tuple(r.source for r in fresh), tuple(refused))
