"""The lease telemetry readers as they were before one query served both the series and the
events (two queries: `lease_series`, then `lease_events`): what
`fleet.telemetry.read_lease_telemetry` is held to in tests/fleet/test_telemetry.py."""
from datetime import date

from fleet.models import GpuTelemetryDay
from fleet.telemetry import MINUTES, NONE, CardSeries, _to_datetime, unpack


def lease_series(lease_id, since, until, step_minutes):
    """Each card's samples from `since` to `until`, averaged over steps of `step_minutes`
    (1 = as stored), and its events in that span, in time order."""
    first, last = int(since.timestamp() // 60), int(until.timestamp() // 60)
    rows = (GpuTelemetryDay.objects.filter(lease_id=lease_id, day__gte=_to_datetime(first).date(),
                                           day__lte=_to_datetime(last).date())
            .order_by("node_id", "gpu_index", "day"))
    cards: dict[tuple[int, int], CardSeries] = {}
    sums: dict[tuple[int, int], dict[int, dict]] = {}
    for row in rows:
        key = (row.node_id, row.gpu_index)
        series = cards.setdefault(key, CardSeries(row.node_id, row.gpu_index))
        base = (row.day - date(1970, 1, 1)).days * MINUTES
        day = unpack(row.samples)
        steps = sums.setdefault(key, {})
        of_day, end_of_day = max(0, first - base), min(MINUTES, last - base + 1)
        while of_day < end_of_day:            # a step's slice of each array at a time
            starts = base + of_day - (base + of_day - first) % step_minutes
            until = min(end_of_day, starts + step_minutes - base)
            step = steps.setdefault(starts, {})
            for name, none in NONE.items():
                values = [v for v in day[name][of_day:until] if v != none]
                if values:
                    total = step.setdefault(name, [0, 0])
                    total[0] += sum(values)
                    total[1] += len(values)
            of_day = until
        for event in row.events:
            minute = base + event[0]
            if first <= minute <= last:
                at = _to_datetime(minute)
                series.events.append({"at": at, "kind": event[1], "xid": event[2], "count": event[3]}
                                     if event[1] == "xid" else
                                     {"at": at, "kind": "ecc", "corrected": event[2], "uncorrected": event[3]})
    for key, series in cards.items():
        for minute in sorted(sums[key]):
            totals = sums[key][minute]
            if totals:
                series.points.append((_to_datetime(minute), {name: round(totals[name][0] / totals[name][1], 1)
                                                             if name in totals else None for name in NONE}))
    return list(cards.values())


def lease_events(lease_id, since, until, limit=200):
    """The lease's Xid and ECC events from `since` to `until`, newest first (the samples are
    not unpacked for them)."""
    first, last = int(since.timestamp() // 60), int(until.timestamp() // 60)
    rows = (GpuTelemetryDay.objects.filter(lease_id=lease_id, day__gte=_to_datetime(first).date(),
                                           day__lte=_to_datetime(last).date()).exclude(events=[])
            .values_list("gpu_index", "day", "events"))
    out = []
    for gpu, day, events in rows:
        base = (day - date(1970, 1, 1)).days * MINUTES
        for event in events:
            if first <= base + event[0] <= last:
                at = _to_datetime(base + event[0])
                out.append({"at": at, "gpu": gpu, "kind": "xid", "xid": event[2], "count": event[3]}
                           if event[1] == "xid" else
                           {"at": at, "gpu": gpu, "kind": "ecc", "corrected": event[2], "uncorrected": event[3]})
    return sorted(out, key=lambda e: (e["at"], e["gpu"]), reverse=True)[:limit]
