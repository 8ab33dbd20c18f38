"""The watch process's cyclic garbage collector: the young generations as CPython runs them,
the oldest one every WATCH_FULL_COLLECTION_SECONDS (docs/adr/0033-*).

Every report a node holds in this process lives up to its interval, long enough to reach
the oldest generation. CPython collects that generation whenever a quarter more objects
have reached it since its last collection, and a collection walks every object there with
the event loop stopped: with thousands of reports held per worker, a pause of a large
fraction of a second every few tens of seconds, and every answer due in it comes late. A
held report is freed by its reference counts when it is answered; only cyclic garbage needs
the walk, and a held report leaves almost none (`bench/fleet_report_cpu.py` prints how
much). So the oldest generation is collected on a timer: the same pause, far less often.
"""
import asyncio
import gc

from django.conf import settings

#: A third threshold that no count of young collections reaches: CPython's own trigger of a
#: full collection never fires (gc.set_threshold).
_NEVER = 2**30

_timer: asyncio.TimerHandle | None = None
_thresholds: tuple[int, int, int] | None = None


def start() -> None:
    """From the ASGI lifespan's startup, on the worker's event loop: the oldest generation
    collected every WATCH_FULL_COLLECTION_SECONDS from now on (0: as CPython collects it)."""
    global _thresholds
    every = settings.WATCH_FULL_COLLECTION_SECONDS
    if every <= 0 or _timer is not None:
        return
    _thresholds = gc.get_threshold()
    gc.set_threshold(_thresholds[0], _thresholds[1], _NEVER)
    _schedule(asyncio.get_running_loop(), every)


def stop() -> None:
    """From the lifespan's shutdown: CPython's thresholds again, no timer."""
    global _timer, _thresholds
    if _timer is not None:
        _timer.cancel()
        _timer = None
    if _thresholds is not None:
        gc.set_threshold(*_thresholds)
        _thresholds = None


def _schedule(loop: asyncio.AbstractEventLoop, every: float) -> None:
    global _timer
    _timer = loop.call_later(every, _collect, loop, every)


def _collect(loop: asyncio.AbstractEventLoop, every: float) -> None:
    gc.collect()
    _schedule(loop, every)
