"""A high per-window limit counted in reservations, not use by use (docs/adr/0029).

``throttle_take`` makes one Redis round trip per use: about 80 µs of a web worker's CPU
(syscalls, redis-py), an eighth of an estimate-API answer. A worker here takes
``units = limit // API_RATE_RESERVATIONS_PER_WINDOW`` uses of the window at once (one
INCRBY) and spends them locally; a limit under that many keeps ``units`` at 1, which is
``throttle_take`` exactly.

What holds, whatever the interleaving of workers (tests/rental/test_throttle_reservations.py,
a Hypothesis state machine):

* **Never more than ``limit`` uses in one window.** A reservation is granted only as far as
  the shared count stays within the limit, and is spent only before its window ends: the
  end is measured from before the round trip (PTTL, read in it, cannot end the key sooner).
* **Refused early by at most the units processes hold unspent**: ``units − 1`` per
  reservation, and a process reserves again only when its own are spent (or its threads
  find them spent at once), so about ``processes × (units − 1)``; they count against the
  client until the window ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: counters with a reservation held in this process (then the ended ones, or the least
#: recently reserved, make room)
KEPT = 4096


class Reservations:
    """One process's unspent reservations: counter key → [units left, monotonic end]."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.held: dict[str, list] = {}
        self.lock = threading.Lock()

    def take(self, backend, counter: str, *, limit: int, units: int, window_seconds: int) -> bool:
        """One use of ``counter`` within ``limit`` per window, from a reservation of this
        process or a new one of ``units`` from ``backend.reserve`` (None: the cache is down,
        and the limit fails open, as every throttle here does)."""
        with self.lock:
            held = self.held.get(counter)
            if held is not None and held[0] > 0 and held[1] > self.clock():
                held[0] -= 1
                return True
        sent = self.clock()
        reply = backend.reserve(counter, units, window_seconds)
        if reply is None:
            return True
        count, ttl_ms = reply
        granted = min(units, limit - (count - units))  # this reservation's units within the limit
        if granted <= 0:
            return False
        # no expiry read (the key ended between the commands): this use only
        ends = sent + ttl_ms / 1000 if ttl_ms > 0 else sent
        with self.lock:
            # re-inserted last, so that the most recently reserved are kept (``_make_room``)
            held = self.held.pop(counter, None)
            if held is not None and held[1] > self.clock():  # units left, or another thread's
                held[0] += granted - 1
                held[1] = min(held[1], ends)  # both spent before either window could end
            else:
                held = [granted - 1, ends]
                if len(self.held) >= KEPT:
                    self._make_room()
            self.held[counter] = held
        return True

    def _make_room(self) -> None:
        """Drops the reservations whose window has ended, then, still full, the least recently
        reserved eighth (a scan per eighth, not per new counter): clearing all would let
        someone with many addresses (IPv6 /64s are cheap) make every busy client's unspent
        units count against it again and again."""
        now = self.clock()
        for counter in [c for c, (_, ends) in self.held.items() if ends <= now]:
            del self.held[counter]
        if len(self.held) >= KEPT:
            for counter in list(self.held)[:max(1, KEPT // 8)]:
                del self.held[counter]


def reservation_units(limit: int, reservations_per_window: int) -> int:
    return max(1, limit // max(1, reservations_per_window))
