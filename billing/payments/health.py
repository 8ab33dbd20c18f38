"""Is a coin's node fit to take payments? The watcher records each pass (error, or the
time of the node's best block); a coin whose last pass failed, or whose best block is
older than ``PAYMENT_NODE_MAX_TIP_AGE_MINUTES`` (node behind or stuck), is not offered
and shows on the operators' dashboard."""
from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils.translation import gettext

from inventory.audit import audit_record

from ..models import WatcherCursor
from . import config


def coin_health(coin: str, now: datetime) -> str | None:
    """None when healthy, else why not (for operators; customers get a general message)."""
    row = WatcherCursor.objects.filter(coin=coin).values("last_error", "tip_time").first()
    return _unwell(row, now) if row else None


def coins_unwell(now: datetime) -> list[tuple[str, str]]:
    rows = WatcherCursor.objects.order_by("coin").values("coin", "last_error", "tip_time")
    return [(r["coin"], reason) for r in rows if (reason := _unwell(r, now))]


def _unwell(row: Mapping[str, Any], now: datetime) -> str | None:
    if row["last_error"]:
        return gettext("node unreachable or failing: %(error)s") % {"error": row["last_error"]}
    if row["tip_time"] and now - row["tip_time"] > config.node_max_tip_age():
        minutes = int((now - row["tip_time"]).total_seconds() // 60)
        return gettext("node behind: its best block is %(minutes)s min old") % {"minutes": minutes}
    return None


def coin_health_record(*, coin: str, now: datetime, error: str = "", tip_time: int | None = None) -> None:
    """One watcher pass's outcome; an audit row when the node turns unwell or recovers."""
    with transaction.atomic():
        cursor, _ = WatcherCursor.objects.select_for_update().get_or_create(coin=coin)
        was_failing = bool(cursor.last_error)
        fields: dict[str, object] = {"last_error": error[:300]}
        if not error:
            fields.update(last_ok_at=now, tip_time=datetime.fromtimestamp(tip_time, tz=UTC) if tip_time else None)
        WatcherCursor.objects.filter(pk=cursor.pk).update(**fields)
        if was_failing != bool(error):
            audit_record(actor=None, action="coin_node_failing" if error else "coin_node_recovered", obj=cursor,
                         detail={"coin": str(coin), "error": error[:300]})


# --- A watcher's downtime never makes an on-time payment lose to the expiry sweeps ---

def awaiting_watchers(now: datetime, *, coin_field: str, deadline_field: str) -> Q:
    """Rows (quotes, or order invoices through their quotes) whose deadline the coin's
    watcher has not scanned past yet — it was down, or still catching up with the chain —
    for at most PAYMENT_WATCHER_LAG_MAX_MINUTES past the deadline. The expiry sweeps leave
    them alone, so a payment the chain dates on time is applied before the sweep could
    cancel the order, in whatever order the two run after an outage."""
    behind = Q(pk__in=[])
    for coin in config.adapters():
        row = WatcherCursor.objects.filter(coin=coin).values("scanned_to").first()
        if row is None:  # never ran: its first pass starts at the chain's tip, it would see nothing older
            continue
        scanned_to = row["scanned_to"]
        unseen = Q(**{coin_field: str(coin)})
        if scanned_to is not None:
            unseen &= Q(**{f"{deadline_field}__gt": scanned_to})
        behind |= unseen
    return behind & Q(**{f"{deadline_field}__gt": now - config.watcher_lag_max()})
