"""GPU telemetry at the storefront (fleet/telemetry.py): a report's samples land on the lease
that held each card at that minute, packed one row per lease-card-day; implausible values
are refused without a 500; a resent batch is stored once. The property at the end drives
the agent's real buffer (nodeagent/telemetry.py) through lost, duplicated and reordered
reports against the storefront's real merge."""
import json
import random
from datetime import UTC, date, datetime, timedelta

from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleet.models import GpuTelemetryDay
from fleet.telemetry import (
    MINUTES,
    day_facts,
    empty_day,
    merge_events,
    merge_samples,
    pack,
    read_lease_telemetry,
    unpack,
)
from inventory.models import SlotAllocation
from nodeagent.telemetry import Telemetry

from .conftest import node_of


def cards_of(lease) -> list[int]:
    return sorted(SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True)
                  .values_list("slot__index", flat=True))


def this_minute() -> int:
    return int(timezone.now().timestamp() // 60)


def field(start, samples, events=()):
    return {"start": start, "samples": [list(s) for s in samples], "events": [list(e) for e in events]}


def test_samples_land_on_the_lease_that_holds_the_card(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    card = cards_of(lease)[0]
    free = max(cards_of(lease)) + 1            # a card of the node no lease holds
    start = this_minute()
    answer = node.post(node.body(telemetry=field(start, [[0, card, 87, 40960, 61, 402, 1755],
                                                         [0, free, 0, 0, 30, 60, 210]],
                                                  [[0, card, "xid", 79, 1], [0, card, "ecc", 3, 0]]))).json()
    assert "telemetry" in answer["accepted"] and answer["refused"] == []
    row = GpuTelemetryDay.objects.get()
    assert (row.lease_id, row.node_id, row.gpu_index, row.minutes) == (lease.pk, node.node.pk, card, 1)
    of_day = start % MINUTES
    day = unpack(row.samples)
    assert [day[c][of_day] for c in ("util", "mem_mb", "temp_c", "power_w", "sm_mhz")] == [87, 40960, 61, 402, 1755]
    assert row.events == [[of_day, "ecc", 3, 0], [of_day, "xid", 79, 1]]
    assert row.last_busy_minute == of_day
    # a resent batch (the answer was lost) and a later minute: stored once, events not doubled
    node.post(node.body(telemetry=field(start, [[0, card, 87, 40960, 61, 402, 1755], [1, card, 3, 512, 50, 90, 345]],
                                        [[0, card, "xid", 79, 1], [0, card, "ecc", 3, 0]])))
    row.refresh_from_db()
    assert row.minutes == 2 and len(row.events) == 2
    # the facts kept as minutes arrive are those of the whole day's arrays
    assert {k: getattr(row, k) for k in ("minutes", "first_minute", "last_minute", "last_busy_minute")} == \
        day_facts(unpack(row.samples))
    since, until = datetime.fromtimestamp(start * 60, UTC), datetime.fromtimestamp((start + 1) * 60, UTC)
    series, events = read_lease_telemetry(lease.pk, series_since=since, events_since=since, until=until)
    assert [p[1]["util"] for p in series[0].points] == [87, 3]
    assert [e["kind"] for e in series[0].events] == ["ecc", "xid"]
    assert sorted(e["kind"] for e in events) == ["ecc", "xid"] and {e["gpu"] for e in events} == {card}


def test_implausible_values_are_refused_not_a_500(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    card, start = cards_of(lease)[0], this_minute()
    answer = node.post(node.body(telemetry=field(start, [
        [0, card, 150, 1, 1, 1, 1],            # utilisation over 100 %
        [0, card, 5, 1, -4, 1, 1],             # negative temperature
        [0, card, 5, 1, 40, 99999, 1],         # 100 kW
        [0, 99, 5, 1, 40, 1, 1],               # no such card index
        [10**6, card, 5, 1, 40, 1, 1],         # in the future
        [0, card, "5", 1, 40, 1, 1],           # not a number
        [0, card, 5, 1, 40, 300, None],        # plausible (a value the card does not give)
    ], [[0, card, "xid", -1, 1], [0, card, "boom"]]))).json()
    assert "telemetry" in answer["accepted"]
    assert [r["item"] for r in answer["refused"]] == [f"telemetry.samples[{i}]" for i in range(6)] + [
        "telemetry.events[0]", "telemetry.events[1]"]
    assert GpuTelemetryDay.objects.get().minutes == 1
    for bad in ("x", [1], {"start": "x"}, {"start": start, "samples": "x"}, {"start": -1},
                {"start": start, "samples": [[0, card, 1, 1, 1, 1, 1]] * 2001}):
        response = node.post(node.body(telemetry=bad))
        assert response.status_code == 200
        assert {"item": "telemetry", "error": "invalid"} in response.json()["refused"]


def test_a_day_of_one_card_packs_into_a_few_kilobytes():
    """The figure docs/adr/0016-gpu-telemetry.md quotes: a busy card's day, realistic noise."""
    rng = random.Random(7)
    day = empty_day()
    merge_samples(day, {m: {"util": min(100, max(0, 80 + rng.randint(-15, 15))), "mem_mb": 61000 + rng.randint(0, 900),
                            "temp_c": 60 + rng.randint(0, 8), "power_w": 520 + rng.randint(-60, 60),
                            "sm_mhz": rng.choice((1755, 1785, 1980))} for m in range(MINUTES)})
    busy = len(pack(day))
    idle = empty_day()
    merge_samples(idle, {m: {"util": 0, "mem_mb": 0, "temp_c": 31, "power_w": 68, "sm_mhz": 345} for m in range(MINUTES)})
    print(f"bytes per card-day: busy {busy}, idle {len(pack(idle))}, raw {10 * MINUTES}")
    assert busy < 12_000 and len(pack(idle)) < 200
    assert unpack(pack(day)) == day


# --- the property: each sample exactly once -------------------------------------------------

class Probe:
    def __init__(self):
        self.minute = 0

    def telemetry(self):
        self.minute += 1
        return [{"index": c, "util": (self.minute * 7 + c) % 101, "mem_mb": self.minute, "temp_c": 40 + c,
                 "power_w": 100, "sm_mhz": 1000, "ecc_corrected": self.minute // 3, "ecc_uncorrected": 0,
                 "xids": [13] if (self.minute + c) % 5 == 0 else []} for c in range(2)]


class Storefront:
    """The report rules (PROTOCOL.md): a seq not above the last accepted is refused whole
    (409 replayed); otherwise the field is stored with fleet.telemetry's merge."""

    def __init__(self):
        self.last_seq, self.days, self.events = 0, {}, {}

    def receive(self, seq: int, batch: dict | None) -> dict | None:
        if seq <= self.last_seq:
            return None                                   # refused: the agent keeps its samples
        self.last_seq = seq
        if batch is None:
            return {"accepted": [], "refused": []}
        for offset, card, *values in batch["samples"]:
            day, of_day = divmod(batch["start"] + offset, MINUTES)
            merge_samples(self.days.setdefault((card, day), empty_day()),
                          {of_day: dict(zip(("util", "mem_mb", "temp_c", "power_w", "sm_mhz"), values, strict=True))})
        for offset, card, *rest in batch["events"]:
            day, of_day = divmod(batch["start"] + offset, MINUTES)
            self.events[(card, day)] = merge_events(self.events.get((card, day), []), [[of_day, *rest]])
        return {"accepted": ["telemetry"], "refused": []}


# Each poll: sample (or not), then the report's fate: delivered, lost on the way, answered but
# the answer lost, delivered twice, or held back and delivered after the next one (reordered).
FATES = st.sampled_from(["ok", "lost", "answer_lost", "duplicated", "delayed"])


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(polls=st.lists(st.tuples(st.booleans(), FATES), min_size=1, max_size=60), per_report=st.integers(1, 7),
       send_minutes=st.integers(1, 5))
def test_any_report_history_stores_each_sample_exactly_once(tmp_path_factory, polls, per_report, send_minutes):
    clock = [1_000_000 * 60]
    t = Telemetry(Probe(), tmp_path_factory.mktemp("t") / "t.json", per_report=per_report,
                  send_minutes=send_minutes, clock=lambda: clock[0])
    shop, seq, held, now = Storefront(), 0, None, 1_000_000 * 60
    sampled: dict[tuple[int, int], int] = {}
    for do_sample, fate in polls:
        if do_sample:
            now += 60
            clock[0] = now
            t.sample(now)
            sampled.update({(minute, card): util for minute, card, util, *_ in t.samples if minute == now // 60})
        seq += 1
        batch = t.batch()
        body = (seq, json.loads(json.dumps(batch)))
        if fate == "ok":
            t.settle(shop.receive(*body))
        elif fate == "lost":
            t.settle(None)
        elif fate == "answer_lost":
            shop.receive(*body)
            t.settle(None)
        elif fate == "duplicated":
            answer = shop.receive(*body)
            shop.receive(*body)                            # the copy: refused by its seq
            t.settle(answer)
        elif fate == "delayed":
            t.settle(None)                                 # no answer yet: the agent sends the next
            if held is not None:
                shop.receive(*held)
            held = body
    if held is not None:
        shop.receive(*held)                                # the delayed one arrives last (refused: old seq)
    clock[0] = now + 600                                   # later: whatever waits is old enough
    while (batch := t.batch()) is not None:                # the storefront answers again
        seq += 1
        t.settle(shop.receive(seq, batch))
    stored = {(day * MINUTES + m, card): d["util"][m] for (card, day), d in shop.days.items()
              for m in range(MINUTES) if d["util"][m] != 0xFF}
    assert stored == sampled
    # events: each Xid once per (card, minute), ECC growth summed exactly to the counter's
    xids = sum(1 for evs in shop.events.values() for e in evs if e[1] == "xid")
    assert xids == sum(1 for (minute, card) in sampled if (minute - 1_000_000 + card) % 5 == 0)
    for card in (0, 1):
        grown = sum(e[2] for (c, _), evs in shop.events.items() if c == card for e in evs if e[1] == "ecc")
        assert grown == len({m for m, _ in sampled}) // 3       # the counter is minute // 3


def test_a_minute_of_telemetry_costs_a_few_queries(paid_lease, enrol):
    """What one report in four adds at a 15 s poll: the card holders, the rows under a lock and
    one UPDATE of them (and their INSERT once a day), whatever the number of cards."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    lease = paid_lease(offer="2x-a100-sxm")
    node = enrol(node_of(lease))
    cards, start = cards_of(lease), this_minute()
    node.post(node.body(telemetry=field(start, [[0, c, 50, 1, 40, 100, 1000] for c in cards])))   # rows made
    with CaptureQueriesContext(connection) as without:
        node.post(node.body())
    with CaptureQueriesContext(connection) as with_telemetry:
        node.post(node.body(telemetry=field(start + 1, [[0, c, 50, 1, 40, 100, 1000] for c in cards])))
    added = [q["sql"] for q in with_telemetry.captured_queries[len(without.captured_queries):]]
    print(f"queries: {len(without.captured_queries)} without, {len(with_telemetry.captured_queries)} with telemetry")
    assert len(with_telemetry.captured_queries) - len(without.captured_queries) <= 5, added


# --- reading: the series and the events in one query -----------------------------------------

DAY0 = date(2026, 11, 5)
CARD_DAYS = st.dictionaries(
    st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 15)),          # (node, card, day)
    st.tuples(st.dictionaries(st.integers(0, MINUTES - 1), st.integers(0, 100), max_size=6),  # minute: util
              st.lists(st.tuples(st.integers(0, MINUTES - 1), st.booleans(), st.integers(0, 90)), max_size=3)),
    max_size=8)


def test_one_read_gives_the_series_and_the_events_the_two_reads_gave(paid_lease):
    """read_lease_telemetry (one query) against the two readers it replaced
    (tests/fleet/reference_telemetry.py), on random card-days of two nodes and random windows:
    the same series, and the same events (ties in time and card in either order)."""
    from inventory.models import Node

    from .reference_telemetry import lease_events, lease_series

    lease = paid_lease()
    nodes = [node_of(lease), Node.objects.exclude(pk=node_of(lease).pk).first()]
    base = datetime(DAY0.year, DAY0.month, DAY0.day, tzinfo=UTC)

    @hsettings(max_examples=60, deadline=None)
    @given(rows=CARD_DAYS, series_from=st.integers(0, 16 * MINUTES), events_from=st.integers(0, 16 * MINUTES),
           length=st.integers(1, 3 * MINUTES), step=st.sampled_from([1, 7, 60, 1440]), limit=st.integers(1, 10))
    def check(rows, series_from, events_from, length, step, limit):
        GpuTelemetryDay.objects.filter(lease=lease).delete()
        stored = []
        for (node, card, day), (utils, events) in rows.items():
            samples = empty_day()
            merge_samples(samples, {m: {"util": u, "mem_mb": 100, "temp_c": 40, "power_w": 90, "sm_mhz": 1000}
                                    for m, u in utils.items()})
            stored.append(GpuTelemetryDay(
                lease=lease, node=nodes[node], gpu_index=card, day=DAY0 + timedelta(days=day),
                samples=pack(samples),
                events=sorted([m, "xid", code, 1] if xid else [m, "ecc", code, 0] for m, xid, code in events)))
        GpuTelemetryDay.objects.bulk_create(stored)
        until = base + timedelta(minutes=max(series_from, events_from) + length)
        series_since, events_since = base + timedelta(minutes=series_from), base + timedelta(minutes=events_from)

        series, events = read_lease_telemetry(lease.pk, series_since=series_since, events_since=events_since,
                                              until=until, step_minutes=step, events_limit=limit)

        assert series == lease_series(lease.pk, series_since, until, step)
        before = lease_events(lease.pk, events_since, until, limit=limit)
        assert [(e["at"], e["gpu"]) for e in events] == [(e["at"], e["gpu"]) for e in before]
        if len(lease_events(lease.pk, events_since, until, limit=10**6)) <= limit:
            assert sorted(map(repr, events)) == sorted(map(repr, before))
        assert read_lease_telemetry(lease.pk, series_since=None, events_since=events_since, until=until)[0] == []

    check()
