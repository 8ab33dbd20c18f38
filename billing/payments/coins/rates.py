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
#: what a stored rate can hold (USD per coin, 8 decimal places, 20 digits): an answer outside
#: is no price, whatever a source says
MIN_RATE, MAX_RATE = Decimal("0.00000001"), Decimal(10) ** 12


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


# --- which answers a rate may be made of ----------------------------------------------------

def fresh_answers(sources, coin: Coin, now: datetime, max_age: timedelta) -> tuple[list[Rate], list[str]]:
    """Each source's fresh answer, and why the others were left out; no fresh answer at all
    → ``RateUnavailable`` (with every source's reason)."""
    fresh, refused = [], []
    for source in sources:
        try:
            rate = source.rate(coin, now)
        except RateUnavailable as exc:
            refused.append(str(exc))
            continue
        if is_stale(rate, now, max_age):
            refused.append(f"{rate.source}: stale ({rate.at.isoformat()})")
        elif not MIN_RATE <= rate.usd_per_coin < MAX_RATE:
            refused.append(f"{rate.source}: out of range (${rate.usd_per_coin:f})")
        else:
            fresh.append(rate)
    if not fresh:
        raise RateUnavailable(f"{coin}: no fresh source; " + "; ".join(refused))
    return fresh, refused


def low_median(values) -> Decimal:
    """The middle value; of an even count the lower of the two middle ones — always a value
    some source gave, never a mean a liar can drag (and the lower rate asks more coins of a
    quote and credits fewer dollars for a late payment: within the tolerance, the store's side)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def bps_apart(value: Decimal, reference: Decimal) -> Decimal:
    """How far ``value`` is from ``reference``, in basis points of ``reference``."""
    return abs(value - reference) * 10_000 / reference


@dataclass(frozen=True)
class Verdict:
    """What the price guard made of one round of answers.

    ``rate``: the rate to use, or None (refused: quoting in the coin stops, ``reason`` says
    why). ``proposed``: the median of the agreeing answers — what an operator would confirm.
    ``quorum``: enough sources agreed for the rate to be the new anchor (below, a rate is only
    accepted close to the anchor)."""

    rate: Rate | None
    reason: str
    proposed: Rate
    agreeing: tuple[str, ...]
    quorum: bool = False


def judge(fresh: list[Rate], *, last: Decimal | None, anchor: Decimal | None, quorum: int,
          tolerance_bps: int, max_move_bps: int) -> Verdict:
    """The price guard, for one coin (pure: the caller reads ``last`` and ``anchor``).

    1. The answers agreeing with their median within ``tolerance_bps`` must be a strict
       majority of the fresh answers, else the sources disagree.
    2. The rate is the median of the agreeing answers. It may move less than ``max_move_bps``
       from ``last`` (the last accepted rate).
    3. ``quorum`` (at least 1) agreeing answers make a rate that becomes the ``anchor``. Fewer
       are accepted only within ``max_move_bps`` of the anchor too (the last rate a quorum or
       an operator set), so one source cannot walk the price away step by step.
    4. A first rate (no ``last``) needs a quorum of at least two; one source alone waits for
       an operator's confirmation.
    """
    coin = fresh[0].coin
    centre = low_median(r.usd_per_coin for r in fresh)
    agreeing = [r for r in fresh if bps_apart(r.usd_per_coin, centre) <= tolerance_bps]
    names = tuple(r.source for r in agreeing)
    proposed = Rate(coin, low_median(r.usd_per_coin for r in agreeing), ("median:" + ",".join(names))[:40],
                    min(r.at for r in agreeing))

    def refuse(reason: str) -> Verdict:
        return Verdict(None, reason, proposed, names)

    value = proposed.usd_per_coin
    if 2 * len(agreeing) <= len(fresh):
        return refuse(f"the sources disagree: {len(agreeing)} of {len(fresh)} within "
                      f"{_pct(tolerance_bps)} of their median ({_answers(fresh)})")
    enough = len(agreeing) >= max(quorum, 1)
    if last is None:
        if enough and len(agreeing) >= 2:
            return Verdict(proposed, "", proposed, names, quorum=True)
        return refuse(f"a first rate from {len(agreeing)} source(s) needs an operator's confirmation "
                      f"({_answers(agreeing)})")
    moved = bps_apart(value, last)
    if moved >= max_move_bps:
        return refuse(f"{_usd(value)} is {_pct(moved)} from the last accepted rate {_usd(last)} "
                      f"(bound {_pct(max_move_bps)}; {_answers(agreeing)})")
    if not enough:
        if anchor is None:
            return refuse(f"{len(agreeing)} source(s) of the {max(quorum, 1)} needed, and no rate a quorum or an "
                          f"operator set to hold it to: an operator's confirmation is needed ({_answers(agreeing)})")
        drift = bps_apart(value, anchor)
        if drift >= max_move_bps:
            return refuse(f"{len(agreeing)} source(s) of the {max(quorum, 1)} needed, and {_usd(value)} is "
                          f"{_pct(drift)} from {_usd(anchor)}, the last rate a quorum or an operator set "
                          f"(bound {_pct(max_move_bps)}; {_answers(agreeing)})")
    return Verdict(proposed, "", proposed, names, quorum=enough)


def _pct(bps) -> str:
    return f"{Decimal(bps) / 100:.2f}%"


def _usd(value: Decimal) -> str:
    return f"${Decimal(value).normalize():f}"


def _answers(rates: list[Rate]) -> str:
    return ", ".join(f"{r.source} {_usd(r.usd_per_coin)}" for r in rates)
