"""What a coin amount is worth: the rate a quote may lock (operator's, the price sources'
through the price guard, or the stablecoin peg; stale rates refused, none while the guard has
stopped quoting in the coin) and base units → USD cents, always rounded down.

The price guard (``rates.judge``, docs/adr/0006): each refresh either accepts the sources'
rate — enough of them agree and it moved less than the bound — or refuses it, and then
quoting in that coin stops (``rate_for`` refuses with a message for the customer; quotes
already made keep their locked rate) and the operators' dashboard says why, until a later
round passes or an operator sets the rate by hand (``coin_rate_set``: that is the
confirmation of a rate the guard would not take on its own)."""
from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal, localcontext

from django.db import transaction
from django.utils.translation import gettext

from inventory.audit import audit_record

from ..models import CoinRate, CoinRateGuard
from ..services import BillingError
from . import config
from .coins.base import Coin
from .coins.rates import (
    HttpJsonSource,
    Rate,
    RateUnavailable,
    Verdict,
    fresh_answers,
    is_stale,
    judge,
)

log = logging.getLogger("billing.payments")
#: what an operator's hand-set rate is called; a fresh one is never overwritten by the feeds
MANUAL_SOURCE = "operator"


class PaymentError(BillingError):
    """A refused payment operation, with a message fit for the customer."""


def rate_for(coin: Coin, now: datetime) -> Rate:
    """The operator's rate (CoinRate), else the peg for stablecoins; stale rates refused, and
    every rate while the price guard has stopped quoting in the coin."""
    if CoinRateGuard.objects.filter(coin=coin, stopped_at__isnull=False).exists():
        raise PaymentError(gettext("%(coin)s payments are paused: our price sources do not agree on the %(coin)s "
                                   "exchange rate right now, so we cannot quote a fair amount. Your order is not "
                                   "changed; please pay with another coin or try again later.") % {"coin": coin})
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


def fresh_rate_or_none(coin: Coin | str, now: datetime) -> Decimal | None:
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


def rates_refresh(*, coins, now: datetime, sources=None) -> dict[str, str]:
    """Each coin's rate from the operator's price sources (``PRICE_SOURCES``; ``sources``:
    objects with ``rate(coin, now)``, for tests), through the price guard: stored when it
    passes, else quoting in the coin stops (``CoinRateGuard``). A fresh rate set by hand
    stays (manual override); stablecoins keep their peg unless a rate is set. Returns what
    happened per coin."""
    with transaction.atomic():
        if sources is None:
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
                fresh, left_out = fresh_answers(sources, coin, now, config.rate_max_age())
            except RateUnavailable as exc:  # nobody answered: the old rate stands until it is stale
                log.warning("no %s rate from the price sources: %s", coin, exc)
                done[str(coin)] = f"error: {exc}"[:300]
                continue
            guard, _ = CoinRateGuard.objects.select_for_update().get_or_create(coin=coin)
            verdict = judge(fresh, last=row.usd_per_coin if row else None, anchor=guard.anchor_usd_per_coin,
                            quorum=config.price_sources_min(), tolerance_bps=config.price_tolerance_bps(),
                            max_move_bps=config.price_max_move_bps())
            if verdict.rate is None:
                if left_out:
                    verdict = dataclasses.replace(verdict, reason=f"{verdict.reason}; left out: {'; '.join(left_out)}")
                _quoting_stop(guard, verdict, now)
                done[str(coin)] = f"refused: {verdict.reason}"[:300]
                continue
            value = verdict.rate.usd_per_coin.quantize(Decimal("0.00000001"))
            CoinRate.objects.update_or_create(coin=coin, defaults={
                "usd_per_coin": value, "source": verdict.rate.source, "set_at": verdict.rate.at})
            _quoting_resume(guard, value, verdict.rate.source, now, anchor=verdict.quorum, actor=None)
            done[str(coin)] = f"{value} from {len(verdict.agreeing)} source(s)"
        return done


def _quoting_stop(guard: CoinRateGuard, verdict: Verdict, now: datetime) -> None:
    """A refused round: quoting in the coin stops (audited when it stops, not every minute),
    the reason and the proposed rate kept for the dashboard."""
    (log.warning if guard.stopped_at else log.error)("%s rate refused, quoting stopped: %s", guard.coin,
                                                      verdict.reason)
    fields = {"checked_at": now, "reason": verdict.reason[:600],
              "proposed_usd_per_coin": verdict.proposed.usd_per_coin.quantize(Decimal("0.00000001")),
              "proposed_source": verdict.proposed.source}
    if guard.stopped_at is None:
        fields["stopped_at"] = now
        audit_record(actor=None, action="coin_rate_refused", obj=guard, at=now,
                     detail={"coin": guard.coin, "reason": verdict.reason[:600],
                             "proposed": str(verdict.proposed.usd_per_coin)})
    CoinRateGuard.objects.filter(pk=guard.pk).update(**fields)


def _quoting_resume(guard: CoinRateGuard, value: Decimal, source: str, now: datetime, *, anchor: bool,
                    actor) -> None:
    """An accepted rate: quoting resumes (audited) and a quorum's or an operator's rate
    becomes the anchor."""
    fields: dict = {}
    if anchor:
        fields.update(anchor_usd_per_coin=value, anchor_source=source[:40], anchor_at=now)
    if guard.stopped_at is not None:
        fields.update(stopped_at=None)
        audit_record(actor=actor, action="coin_rate_resumed", obj=guard, at=now,
                     detail={"coin": guard.coin, "usd_per_coin": str(value), "source": source,
                             "stopped_at": guard.stopped_at.isoformat(), "reason": guard.reason})
    if fields:
        CoinRateGuard.objects.filter(pk=guard.pk).update(**fields)


def rates_stopped() -> list[CoinRateGuard]:
    """The coins whose quoting the price guard stopped, for the operators' dashboard."""
    return list(CoinRateGuard.objects.filter(stopped_at__isnull=False).order_by("coin"))


def rate_stop_alert(guard: CoinRateGuard) -> str:
    """One dashboard line: since when, why, and what an operator does about it."""
    proposed = f"${guard.proposed_usd_per_coin.normalize():f}" if guard.proposed_usd_per_coin else "none"
    return (f"{guard.coin} quotes refused since {guard.stopped_at:%Y-%m-%d %H:%M} UTC: the price sources' rate was "
            f"not accepted: {guard.reason} (their median: {proposed} from {guard.proposed_source or 'none'}). "
            f"Quoting resumes when they pass again, or set the {guard.coin} rate by hand under Coin rates to "
            f"confirm one.")


def coin_rate_set(*, coin: str, usd_per_coin: Decimal, actor, now: datetime, source: str = MANUAL_SOURCE) -> CoinRate:
    """An operator sets a coin's rate (USD per whole coin); dated now, audited. The operator
    is the price guard's last word: the rate becomes its anchor, and quoting in the coin
    resumes if the guard had stopped it (this is how a refused rate is confirmed)."""
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
        guard, _ = CoinRateGuard.objects.select_for_update().get_or_create(coin=coin)
        _quoting_resume(guard, Decimal(usd_per_coin), rate.source, now, anchor=True, actor=actor)
        return rate
