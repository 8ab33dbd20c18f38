"""The idle notice: when every card of an active lease has stayed under
WORKBENCH_IDLE_UTIL_PERCENT for WORKBENCH_IDLE_HOURS, its customer is told once per idle
stretch — in-app, by e-mail and as the webhook event `lease.idle` — unless the account
turned the notice off (CustomerSettings.idle_notices). Run by the beat job `idle_notices`
(fleet/tasks.py) every WORKBENCH_IDLE_CHECK_SECONDS.

"Once per stretch" is the notifications ledger's rule (one notice per lease, kind and
deadline) with the stretch's start as the deadline: the minute after the last busy sample of
the lease's cards (GpuTelemetryDay.last_busy_minute, kept as samples arrive), or its first
sample when none was busy. A busy minute starts a new stretch, so the next idle day is told
again; the same stretch, checked every hour, keeps its start and is told once."""
from datetime import datetime, timedelta

from django.conf import settings
from django.utils.translation import gettext as _

from inventory.models import SlotAllocation
from rental.lifecycle import BATCH, DUE_LEASE_RELATED
from rental.models import Lease, LeaseState
from rental.notifications.notices import Notice, customer_language, notify_many

from .models import GpuTelemetryDay
from .telemetry import MINUTES, _to_datetime

KIND = "gpus_idle"
#: A card's readings must reach this close to the stretch's start and to now for the lease to
#: count as idle: an agent that stopped sending is not an idle GPU.
COVERAGE_MINUTES = 60


def idle_since(cards: set[tuple[int, int]], rows: list[tuple], now_minute: int) -> int | None:
    """The minute the lease's idle stretch began, or None while a card has no recent readings.
    `rows`: (node, gpu, day as minutes, first, last, last busy minute of the day)."""
    per_card: dict[tuple[int, int], list] = {}
    for node, gpu, base, first, last, busy in rows:
        if (node, gpu) not in cards or first is None:
            continue
        card = per_card.setdefault((node, gpu), [None, None, None])
        card[0] = base + first if card[0] is None else min(card[0], base + first)
        card[1] = base + last if card[1] is None else max(card[1], base + last)
        if busy is not None:
            card[2] = base + busy if card[2] is None else max(card[2], base + busy)
    if not cards or set(per_card) != cards:
        return None
    starts = []
    for first, last, busy in per_card.values():
        if last < now_minute - COVERAGE_MINUTES:
            return None
        starts.append(first if busy is None else busy + 1)
    return max(starts)


def sweep_idle_notices(now: datetime, limit: int = BATCH) -> list[Notice]:
    hours = settings.WORKBENCH_IDLE_HOURS
    now_minute = int(now.timestamp() // 60)
    recent = (now - timedelta(hours=2)).date()
    leases = list(Lease.objects.filter(state=LeaseState.ACTIVE, gpu_telemetry__day__gte=recent).distinct()
                  .exclude(customer__rental_settings__idle_notices=False)
                  .select_related(*DUE_LEASE_RELATED).order_by("pk")[:limit * 10])
    if not leases:
        return []
    cards: dict[int, set] = {}
    for lease_id, node_id, index in (SlotAllocation.objects.filter(lease_id__in=[lease.pk for lease in leases],
                                                                   released_at__isnull=True)
                                     .values_list("lease_id", "slot__node_id", "slot__index")):
        cards.setdefault(lease_id, set()).add((node_id, index))
    rows: dict[int, list] = {}
    for lease_id, node_id, gpu, day, first, last, busy in (
            GpuTelemetryDay.objects.filter(lease_id__in=list(cards))
            .values_list("lease_id", "node_id", "gpu_index", "day", "first_minute", "last_minute", "last_busy_minute")):
        rows.setdefault(lease_id, []).append((node_id, gpu, (day.toordinal() - 719163) * MINUTES, first, last, busy))
    notices = []
    for lease in leases:
        start = idle_since(cards.get(lease.pk, set()), rows.get(lease.pk, []), now_minute)
        if start is None or now_minute - start < hours * 60:
            continue
        since = _to_datetime(start)
        args = {"id": lease.pk, "offer": lease.offer, "hours": hours,
                "percent": settings.WORKBENCH_IDLE_UTIL_PERCENT, "since": f"{since:%Y-%m-%d %H:%M}"}
        with customer_language(lease.customer):
            notices.append(Notice(
                lease=lease, kind=KIND, deadline=since,
                subject=_("Lease #%(id)s: your GPUs have been idle for %(hours)s hours") % args,
                body=_("Every GPU of lease #%(id)s (%(offer)s) has been under %(percent)s %% utilisation since "
                       "%(since)s UTC. The lease is still paid and running. If you no longer need it, let it end "
                       "(turn auto-renew off) or cancel it; the lease page shows each GPU's charts. You can turn "
                       "these notices off in your account settings.") % args))
        if len(notices) >= limit:
            break
    return notify_many(notices, now=now)

