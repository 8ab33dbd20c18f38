"""GPU telemetry from the node's report (nodeagent/PROTOCOL.md, "Telemetry"): each card's
per-minute samples mapped to the lease that held that card at that minute and stored as one
row per lease, card and UTC day (GpuTelemetryDay: five packed arrays of 1,440, zlib;
docs/adr/0016-gpu-telemetry.md), plus the series the lease page, the API and the CLI read.

Storing by (lease, node, card, day, minute) — a value set, never added — is what makes a
resent batch harmless: the agent resends until a report is answered, and a sample or an
event that arrives twice lands on the same place."""
import functools
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import BinaryField, Case, F, Q, Value, When

from inventory.models import SlotAllocation

from .models import GpuTelemetryDay

MINUTES = 1440
#: (name, array type, "no sample" value, the highest plausible value): the packed layout.
LAYOUT = (("util", "B", 0xFF, 100), ("temp_c", "B", 0xFF, 130), ("power_w", "H", 0xFFFF, 3000),
          ("sm_mhz", "H", 0xFFFF, 5000), ("mem_mb", "I", 0xFFFFFFFF, 2**20))
NONE = {name: none for name, _, none, _ in LAYOUT}
HIGHEST = {name: high for name, _, _, high in LAYOUT}
#: The wire's order of values after (minute offset, card) (nodeagent/telemetry.py CHANNELS).
WIRE = ("util", "mem_mb", "temp_c", "power_w", "sm_mhz")
MAX_ROWS = 2000            # per report: the agent sends at most 2000 (its config's ceiling)
MAX_GPU_INDEX = 63
REFUSALS_LISTED = 10       # implausible rows named in the answer; the rest only counted
EVENTS_PER_DAY = 2000      # per card-day kept: an Xid storm cannot grow a row without bound


class Invalid(Exception):
    pass


# --- packing (pure: no database) -----------------------------------------------------------

def empty_day() -> dict[str, array]:
    return {name: array(code, [none]) * MINUTES for name, code, none, _ in LAYOUT}


def unpack(blob: bytes | memoryview | None) -> dict[str, array]:
    if not blob:
        return empty_day()
    raw, out, at = zlib.decompress(bytes(blob)), {}, 0
    for name, code, _, _ in LAYOUT:
        values = array(code)
        size = values.itemsize * MINUTES
        values.frombytes(raw[at:at + size])
        if sys.byteorder == "big":
            values.byteswap()
        out[name], at = values, at + size
    return out


def pack(day: dict[str, array]) -> bytes:
    parts = []
    for name, _, _, _ in LAYOUT:
        values = day[name]
        if sys.byteorder == "big":
            values = array(values.typecode, values)
            values.byteswap()
        parts.append(values.tobytes())
    return zlib.compress(b"".join(parts), 3)   # level 3: as small as 6 here, and faster


def merge_samples(day: dict[str, array], samples: dict[int, dict]) -> int:
    """Set each minute's values (a resent minute overwrites itself with the same values).
    Returns how many of those minutes had no sample before."""
    new = 0
    for minute, values in samples.items():
        new += not any(day[name][minute] != NONE[name] for name in NONE)
        for name in NONE:
            value = values.get(name)
            day[name][minute] = NONE[name] if value is None else value
    return new


def merge_events(events: list, new: list) -> list:
    """Events keyed by (minute, kind, code): a resent one replaces itself, never adds."""
    keyed = {tuple(e[:3]) if e[1] == "xid" else tuple(e[:2]): e for e in events}
    for e in new:
        keyed[tuple(e[:3]) if e[1] == "xid" else tuple(e[:2])] = e
    return sorted(keyed.values(), key=lambda e: (e[0], e[1], e[2]))[-EVENTS_PER_DAY:]


def facts_after(row, samples: dict[int, dict], new_minutes: int) -> dict:
    """The row's facts once `samples` were merged, from its facts before and those minutes
    only (a report is one minute of a card: no pass over the day). A sample carries at least
    one value (a card NVML cannot read is left out by the agent), so a merged minute is present."""
    if not samples:
        return {}
    threshold = settings.WORKBENCH_IDLE_UTIL_PERCENT
    minutes = list(samples)
    busy = [m for m, v in samples.items() if v.get("util") is not None and v["util"] >= threshold]
    return {"minutes": row.minutes + new_minutes,
            "first_minute": min(minutes + ([row.first_minute] if row.first_minute is not None else [])),
            "last_minute": max(minutes + ([row.last_minute] if row.last_minute is not None else [])),
            # a resent busy minute now idle cannot lower it (the agent never changes a sample)
            "last_busy_minute": max(busy + ([row.last_busy_minute] if row.last_busy_minute is not None else []),
                                    default=None)}


def day_facts(day: dict[str, array]) -> dict:
    util, threshold = day["util"], settings.WORKBENCH_IDLE_UTIL_PERCENT
    present = [m for m in range(MINUTES) if any(day[n][m] != NONE[n] for n in NONE)]
    busy = [m for m in present if util[m] != NONE["util"] and util[m] >= threshold]
    return {"minutes": len(present), "first_minute": present[0] if present else None,
            "last_minute": present[-1] if present else None, "last_busy_minute": busy[-1] if busy else None}


# --- the report's field ----------------------------------------------------------------------

@dataclass
class Parsed:
    samples: list[tuple[int, int, dict]] = field(default_factory=list)     # (unix minute, card, values)
    events: list[tuple[int, int, list]] = field(default_factory=list)      # (unix minute, card, [kind, …])
    refused: list[dict] = field(default_factory=list)


def _int(v, low: int, high: int) -> bool:
    return type(v) is int and low <= v <= high


def parse(field_value, now: datetime) -> Parsed:
    """Checks the field's shape (Invalid: refused whole) and each row's plausibility (an
    implausible row is refused on its own, the rest stored)."""
    if not isinstance(field_value, dict):
        raise Invalid
    start, samples, events = field_value.get("start"), field_value.get("samples", []), field_value.get("events", [])
    now_minute = int(now.timestamp() // 60)
    oldest = now_minute - settings.WORKBENCH_TELEMETRY_MAX_AGE_DAYS * MINUTES
    if not _int(start, 0, now_minute + 5) or not isinstance(samples, list) or not isinstance(events, list) \
            or len(samples) > MAX_ROWS or len(events) > MAX_ROWS:
        raise Invalid
    out, implausible = Parsed(), []
    for i, row in enumerate(samples):
        if not isinstance(row, list) or len(row) != 2 + len(WIRE) or not _int(row[0], 0, now_minute + 5 - start) \
                or not _int(row[1], 0, MAX_GPU_INDEX) or start + row[0] < oldest \
                or not all(v is None or _int(v, 0, HIGHEST[name]) for name, v in zip(WIRE, row[2:], strict=True)):
            implausible.append(f"telemetry.samples[{i}]")
            continue
        out.samples.append((start + row[0], row[1], dict(zip(WIRE, row[2:], strict=True))))
    for i, row in enumerate(events):
        ok = isinstance(row, list) and len(row) >= 3 and _int(row[0], 0, now_minute + 5 - start) \
            and _int(row[1], 0, MAX_GPU_INDEX) and start + row[0] >= oldest
        if ok and row[2] == "xid" and len(row) == 5 and _int(row[3], 0, 2**16) and _int(row[4], 1, 10**6):
            out.events.append((start + row[0], row[1], ["xid", row[3], row[4]]))
        elif ok and row[2] == "ecc" and len(row) == 5 and _int(row[3], 0, 2**40) and _int(row[4], 0, 2**40):
            out.events.append((start + row[0], row[1], ["ecc", row[3], row[4]]))
        else:
            implausible.append(f"telemetry.events[{i}]")
    out.refused = [{"item": item, "error": "implausible"} for item in implausible[:REFUSALS_LISTED]]
    if len(implausible) > REFUSALS_LISTED:
        out.refused.append({"item": "telemetry", "error": "implausible",
                            "more": len(implausible) - REFUSALS_LISTED})
    return out


def telemetry_accept(outcome, node_id: int, field_value, now: datetime) -> None:
    """The report's `telemetry` (absent: nothing). Adds "telemetry" to the answer's accepted
    items once stored (the agent then drops what it sent), or refuses it whole `invalid`
    (dropped too: resending a malformed field cannot help)."""
    if field_value is None:
        return
    try:
        parsed = parse(field_value, now)
    except Invalid:
        outcome.refused.append({"item": "telemetry", "error": "invalid"})
        return
    outcome.refused += parsed.refused
    if parsed.samples or parsed.events:
        store(node_id, parsed)
    outcome.accepted.append("telemetry")


def _to_datetime(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, UTC)


def _holders(node_id: int, minutes: list[int]) -> dict[int, list[tuple[int, datetime, datetime | None]]]:
    """Per card index, the leases that held it in the minutes' span: (lease, from, until)."""
    low, high = _to_datetime(min(minutes)), _to_datetime(max(minutes) + 1)
    rows = (SlotAllocation.objects.filter(slot__node_id=node_id, allocated_at__lt=high)
            .filter(Q(released_at__isnull=True) | Q(released_at__gt=low))
            .values_list("slot__index", "lease_id", "allocated_at", "released_at"))
    out: dict[int, list] = {}
    for index, lease_id, since, until in rows:
        out.setdefault(index, []).append((lease_id, since, until))
    return out


def _lease_at(holders: list, minute: int) -> int | None:
    """The lease holding the card during that minute: allocated before the minute ended,
    not released before it began (a minute shared by two leases goes to the newer)."""
    start, end = _to_datetime(minute), _to_datetime(minute + 1)
    found = [(since, lease) for lease, since, until in holders if since < end and (until is None or until > start)]
    return max(found)[1] if found else None


def store(node_id: int, parsed: Parsed) -> int:
    """Writes the parsed samples and events into their lease-card-day rows (a few statements
    per report, whatever the number of rows). Returns the rows written. A sample of a card
    no lease held at that minute has no customer to show it to and is not kept."""
    minutes = [m for m, _, _ in parsed.samples] + [m for m, _, _ in parsed.events]
    if not minutes:
        return 0
    holders = _holders(node_id, minutes)
    groups: dict[tuple[int, int, date], dict] = {}
    for kind, items in (("samples", parsed.samples), ("events", parsed.events)):
        for minute, card, values in items:
            lease_id = _lease_at(holders.get(card, []), minute)
            if lease_id is None:
                continue
            day, of_day = divmod(minute, MINUTES)
            group = groups.setdefault((lease_id, card, date(1970, 1, 1) + timedelta(days=day)),
                                      {"samples": {}, "events": []})
            if kind == "samples":
                group["samples"][of_day] = values
            else:
                group["events"].append([of_day, *values])
    if not groups:
        return 0
    # The rows by the sets of leases, cards and days (a plain index scan; a few more rows at
    # most, left out below) rather than one OR per row, which cost more to build than to run.
    wanted = GpuTelemetryDay.objects.select_for_update().filter(
        node_id=node_id, lease_id__in={g[0] for g in groups}, gpu_index__in={g[1] for g in groups},
        day__in={g[2] for g in groups}).order_by("pk")
    with transaction.atomic():
        rows = [r for r in wanted if (r.lease_id, r.gpu_index, r.day) in groups]
        if len(rows) < len(groups):        # a card's first minute of the day: its row made first
            have = {(r.lease_id, r.gpu_index, r.day) for r in rows}
            GpuTelemetryDay.objects.bulk_create(
                [GpuTelemetryDay(lease_id=lease, node_id=node_id, gpu_index=card, day=day, samples=pack(empty_day()))
                 for lease, card, day in groups if (lease, card, day) not in have], ignore_conflicts=True)
            rows = [r for r in wanted.all() if (r.lease_id, r.gpu_index, r.day) in groups]
        for row in rows:
            group = groups[(row.lease_id, row.gpu_index, row.day)]
            if group["samples"]:
                day = unpack(row.samples)
                new = merge_samples(day, group["samples"])
                row.samples = pack(day)
                for name, value in facts_after(row, group["samples"], new).items():
                    setattr(row, name, value)
            if group["events"]:
                row.events = merge_events(row.events, group["events"])
        _rows_update(rows)
    return len(rows)


UPDATED = ("samples", "events", "minutes", "first_minute", "last_minute", "last_busy_minute")


@functools.cache
def _update_sql() -> str:
    def column(name: str) -> str:
        return connection.ops.quote_name(GpuTelemetryDay._meta.get_field(name).column)
    return (f"UPDATE {connection.ops.quote_name(GpuTelemetryDay._meta.db_table)} SET "
            + ", ".join(f"{column(name)} = %s" for name in UPDATED) + f" WHERE {column('id')} = %s")


def _rows_update(rows: list[GpuTelemetryDay]) -> None:
    """One plain UPDATE per row, sent together (bulk_update's CASE expressions cost more to
    build than the rows take to write: bench/fleet.py --telemetry)."""
    fields = [GpuTelemetryDay._meta.get_field(name) for name in UPDATED]
    params = [[f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields] + [row.pk] for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(_update_sql(), params)


# --- reading: the lease page, the API, the CLI -----------------------------------------------

@dataclass
class CardSeries:
    node_id: int
    gpu_index: int
    #: (start of the step, {channel: mean or None}) per step with at least one sample
    points: list[tuple[datetime, dict]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)


def read_lease_telemetry(lease_id: int, *, series_since: datetime | None, events_since: datetime,
                         until: datetime, step_minutes: int = 1,
                         events_limit: int = 200) -> tuple[list[CardSeries], list[dict]]:
    """(series, events) of the lease up to `until`, in one query (the lease page and the
    metrics API show both):

    - series: each card's samples from `series_since` (None: no series), averaged over steps
      of `step_minutes` (1 = as stored), with its events in that span, in time order;
    - events: every card's Xid and ECC events from `events_since`, newest first, at most
      `events_limit`.

    The samples, the rows' bulk, are read and unpacked only for the days the series covers."""
    events_first, last = int(events_since.timestamp() // 60), int(until.timestamp() // 60)
    series_first = int(series_since.timestamp() // 60) if series_since is not None else None
    first_day = _to_datetime(events_first if series_first is None else min(events_first, series_first)).date()
    if series_first is None:
        samples = Value(None, output_field=BinaryField())
    else:
        samples = Case(When(day__gte=_to_datetime(series_first).date(), then=F("samples")),
                       default=Value(None), output_field=BinaryField())
    rows = (GpuTelemetryDay.objects.filter(lease_id=lease_id, day__gte=first_day, day__lte=_to_datetime(last).date())
            .annotate(day_samples=samples).order_by("node_id", "gpu_index", "day")
            .values_list("node_id", "gpu_index", "day", "events", "day_samples"))
    series: list[CardSeries] = []
    sums: list[dict[int, dict]] = []      # per card of `series`: its steps' sums so far
    events: list[dict] = []
    for node_id, gpu, day, day_events, day_samples in rows:
        base = (day - date(1970, 1, 1)).days * MINUTES
        for event in day_events:
            if events_first <= base + event[0] <= last:
                events.append({"at": _to_datetime(base + event[0]), "gpu": gpu, **_event_fields(event)})
        if day_samples is not None and series_first is not None:  # the rows come card by card
            if not series or (series[-1].node_id, series[-1].gpu_index) != (node_id, gpu):
                series.append(CardSeries(node_id, gpu))
                sums.append({})
            _add_day(series[-1], sums[-1], series_first, last, step_minutes, base, unpack(day_samples), day_events)
    for card, steps in zip(series, sums, strict=True):
        for minute in sorted(steps):
            totals = steps[minute]
            if totals:
                card.points.append((_to_datetime(minute), {name: round(totals[name][0] / totals[name][1], 1)
                                                           if name in totals else None for name in NONE}))
    return series, sorted(events, key=lambda e: (e["at"], e["gpu"]), reverse=True)[:events_limit]


def _add_day(card: CardSeries, steps: dict[int, dict], first: int, last: int, step_minutes: int, base: int,
             day: dict, day_events: list) -> None:
    """One stored day of a card into its steps' sums (a step's slice of each array at a
    time) and its events in [first, last] into the card's."""
    of_day, end_of_day = max(0, first - base), min(MINUTES, last - base + 1)
    while of_day < end_of_day:
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
    for event in day_events:
        minute = base + event[0]
        if first <= minute <= last:
            card.events.append({"at": _to_datetime(minute), **_event_fields(event)})


def _event_fields(event: list) -> dict:
    """A stored event ([minute, "xid", code, n] or [minute, "ecc", corrected, uncorrected]) as
    the pages and the API show it, less its time."""
    if event[1] == "xid":
        return {"kind": "xid", "xid": event[2], "count": event[3]}
    return {"kind": "ecc", "corrected": event[2], "uncorrected": event[3]}
