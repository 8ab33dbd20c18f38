"""Waiting on real processes (daemons, workers, guests, chains) with deadlines that scale with
the machine's load, never with sleeps.

A timeout in a test is a bound on a broken system, not a guess about a quiet machine: the
same test runs on an idle developer laptop, on CI's two cores beside two xdist workers, and
under `make test-stress` with a CPU hog beside it. So a deadline is a budget of *unloaded*
seconds, spent more slowly while the machine is busier than it has cores: each poll charges
the wall time since the last one divided by the load factor (the 1-minute load average per
core, at least 1, at most MAX_STRETCH). `TEST_DEADLINE_FACTOR` stretches every budget further
(a slow emulated guest, a debugging session)."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

#: However loaded the machine, a deadline is never stretched more than this: a hung process
#: still fails the test in a bounded time.
MAX_STRETCH = 6.0


def load_factor() -> float:
    """How much slower than an idle machine work runs now: runnable tasks per core (the
    1-minute load average), between 1 and MAX_STRETCH, times TEST_DEADLINE_FACTOR."""
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        per_core = 1.0
    extra = float(os.environ.get("TEST_DEADLINE_FACTOR") or 1)
    return min(max(per_core, 1.0), MAX_STRETCH) * max(extra, 1.0)


def scaled(seconds: float) -> float:
    """A one-shot bound (a subprocess's wait, a thread's join, an HTTP timeout) scaled by the
    load now."""
    return seconds * load_factor()


class Deadline:
    """A budget of unloaded seconds, spent at the load-discounted rate described above."""

    def __init__(self, seconds: float):
        self.budget = seconds
        self.spent = 0.0
        self.started = self._last = time.monotonic()

    def expired(self) -> bool:
        now = time.monotonic()
        self.spent += (now - self._last) / load_factor()
        self._last = now
        return self.spent >= self.budget

    def remaining(self) -> float:
        """Wall seconds a single blocking call may take now (at today's load)."""
        return max(self.budget - self.spent, 0.0) * load_factor()

    @property
    def waited(self) -> float:
        return time.monotonic() - self.started


def wait_for(condition: Callable[[], T], timeout: float, what: str, *, every: float = 0.1,
             alive: Iterable = (), ignore: tuple[type[BaseException], ...] = (),
             detail: Callable[[], str] | None = None) -> T:
    """Poll `condition` until it returns something true (which is returned) or `timeout`
    unloaded seconds are spent; then AssertionError naming `what`, the wall time waited,
    the last exception `ignore`d and `detail()` (a log tail, a console). A process in
    `alive` (Popen) that exits first fails at once, with its exit code."""
    deadline, last_error = Deadline(timeout), None
    procs = list(alive)
    while True:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args!r} exited with {proc.returncode} while waiting for {what}"
                                     + (f"\n{detail()}" if detail else ""))
        try:
            value = condition()
        except ignore as exc:  # not up yet
            value, last_error = None, exc
        if value:
            return value
        if deadline.expired():
            message = f"timed out after {deadline.waited:.0f} s ({timeout} s unloaded) waiting for {what}"
            if last_error is not None:
                message += f"; last error: {last_error!r}"
            raise AssertionError(message + (f"\n{detail()}" if detail else ""))
        time.sleep(every)
