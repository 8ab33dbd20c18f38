"""The API's limits counted in reservations (rental.accounts.throttle_reservations): a
Hypothesis state machine runs several web processes against a model of Redis's fixed
window (INCRBY, EXPIRE NX, PTTL, expiry on a clock, round trips that take time) and checks
after every step that no window ever allowed more than the limit, and that a refusal
came only when the uses allowed plus the units processes hold unspent reached it. The
same limits on real Redis, through the API, run in the PostgreSQL pass."""
from __future__ import annotations

import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rental.accounts.throttle_reservations import Reservations, reservation_units

COUNTER = "throttle:api-address:198.51.100.1"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FixedWindowRedis:
    """Redis as ``core.cache.reserve`` drives it: the first INCRBY of a window starts it
    (EXPIRE NX), the key ends ``timeout`` seconds later, PTTL reads what is left. Each
    round trip takes ``before`` seconds to reach the server and ``after`` to come back."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.count = 0
        self.ends: float | None = None
        self.windows: list[list] = []  # [start, end, units counted in it]
        self.delays = (0.0, 0.0)

    def live(self) -> bool:
        return self.ends is not None and self.clock.now < self.ends

    def reserve(self, key, units: int, timeout: int):
        before, after = self.delays
        self.clock.now += before
        if not self.live():
            self.count, self.ends = 0, self.clock.now + timeout
            self.windows.append([self.clock.now, self.ends, 0])
        self.count += units
        self.windows[-1][2] += units
        ttl_ms = int((self.ends - self.clock.now) * 1000)  # Redis rounds down
        self.clock.now += after
        return self.count, ttl_ms

    def window_at(self, t: float) -> int | None:
        for n, (start, end, _) in enumerate(self.windows):
            if start <= t < end:
                return n
        return None


class ReservationsMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clock = Clock()
        self.redis = FixedWindowRedis(self.clock)
        self.processes: list[Reservations] = []
        self.limit = self.units = 0
        self.allowed: dict[int | None, int] = {}  # window index → uses allowed in it
        self.delayed: set[int] = set()  # windows a slow round trip reserved in

    @precondition(lambda self: not self.processes)
    @rule(processes=st.integers(1, 4), limit=st.integers(1, 200), per_window=st.integers(1, 64))
    def start(self, processes, limit, per_window):
        self.processes = [Reservations(self.clock) for _ in range(processes)]
        self.limit, self.units = limit, reservation_units(limit, per_window)

    def unspent(self) -> int:
        now = self.clock.now
        return sum(held[0] for p in self.processes if (held := p.held.get(COUNTER)) and held[1] > now)

    @precondition(lambda self: self.processes)
    @rule(data=st.data(), before=st.sampled_from([0.0, 0.0, 0.001, 3.0]),
          after=st.sampled_from([0.0, 0.0, 0.001, 3.0]))
    def use(self, data, before, after):
        process = data.draw(st.sampled_from(self.processes))
        self.redis.delays = (before, after)
        counted = self.redis.count, len(self.redis.windows)
        started = self.clock.now
        ok = process.take(self.redis, COUNTER, limit=self.limit, units=self.units, window_seconds=60)
        reserved = (self.redis.count, len(self.redis.windows)) != counted
        window = len(self.redis.windows) - 1
        if reserved and (before or after):
            self.delayed.add(window)
        if ok:
            # a use that reserved counts in the window its INCRBY reached; one spent from a
            # reservation, in the window live when it was spent
            if not reserved:
                window = self.redis.window_at(started)
                assert window is not None, "a reservation spent after its window ended"
            self.allowed[window] = self.allowed.get(window, 0) + 1
        elif window not in self.delayed:
            # without slow round trips no reserved unit is stranded: refused only when what
            # was allowed and what processes hold unspent reach the limit (with slow ones, a
            # reservation also ends up to a round trip before its window)
            start = self.redis.windows[window][0]
            held = sum(h[0] for p in self.processes if (h := p.held.get(COUNTER)) and h[1] > start)
            assert self.allowed.get(window, 0) + held >= self.limit, \
                f"refused with {self.allowed.get(window, 0)} allowed and {held} held unspent, limit {self.limit}"

    @precondition(lambda self: self.processes)
    @rule(seconds=st.sampled_from([0.5, 10.0, 59.0, 61.0]))
    def wait(self, seconds):
        self.clock.now += seconds

    @invariant()
    def no_window_allows_more_than_the_limit(self):
        for window, uses in self.allowed.items():
            assert uses <= self.limit, f"window {window}: {uses} uses allowed, limit {self.limit}"


TestReservations = ReservationsMachine.TestCase
TestReservations.settings = hsettings(max_examples=300, stateful_step_count=60, deadline=None)


def test_one_process_allows_exactly_the_limit_then_refuses():
    clock = Clock()
    redis, process = FixedWindowRedis(clock), Reservations(clock)
    results = [process.take(redis, COUNTER, limit=100, units=8, window_seconds=60) for _ in range(104)]
    assert results == [True] * 100 + [False] * 4
    assert len(redis.windows) == 1 and redis.count > 100  # 13 round trips, not 100
    clock.now += 60
    assert process.take(redis, COUNTER, limit=100, units=8, window_seconds=60)  # a new window


def test_a_cache_that_is_down_fails_open():
    class Down:
        def reserve(self, key, units, timeout):
            return None

    assert Reservations().take(Down(), COUNTER, limit=1, units=8, window_seconds=60)


@pytest.mark.parametrize("limit, per_window, units", [(300, 64, 4), (120, 64, 1), (10**9, 64, 15625000), (5, 0, 5)])
def test_units_are_the_limit_over_the_reservations_per_window(limit, per_window, units):
    assert reservation_units(limit, per_window) == units


def test_a_full_table_drops_ended_reservations_then_the_least_recently_reserved(monkeypatch):
    """Many addresses (cheap IPv6 /64s) must not push out a busy client's reservation while
    it is live: ended ones go first, then the least recently reserved."""
    monkeypatch.setattr("rental.accounts.throttle_reservations.KEPT", 4)
    clock = Clock()
    process = Reservations(clock)

    class PerKey:  # a window per counter, as Redis keeps them
        def __init__(self):
            self.keys: dict[str, FixedWindowRedis] = {}

        def reserve(self, key, units, timeout):
            return self.keys.setdefault(key, FixedWindowRedis(clock)).reserve(key, units, timeout)

    redis = PerKey()

    def take(counter: str) -> bool:
        return process.take(redis, counter, limit=100, units=8, window_seconds=60)

    take("old")
    clock.now += 61                                   # "old"'s window ends
    for counter in ("busy", "a", "b"):
        take(counter)
    take("c")                                         # full: "old" ended, so it goes
    assert set(process.held) == {"busy", "a", "b", "c"}
    for _ in range(8):                                # spends its 7, reserves again: last now
        take("busy")
    take("d")                                         # full, none ended: "a" goes, not "busy"
    assert list(process.held) == ["b", "c", "busy", "d"]
