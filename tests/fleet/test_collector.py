"""fleet/collector.py: in the watch process the oldest generation is collected on a timer,
never by CPython's own trigger, from the ASGI lifespan's startup to its shutdown."""
import asyncio
import gc

import pytest

from fleet import collector
from tests.deadlines import Deadline


@pytest.fixture
def full_collections():
    """The generations of the collections that start meanwhile, in order."""
    seen: list[int] = []

    def record(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.collect()
    gc.callbacks.append(record)
    yield seen
    gc.callbacks.remove(record)
    collector.stop()


def long_lived_growth() -> list:
    """Enough new objects that live on for CPython to collect its oldest generation: over a
    quarter of the objects that already lived long (its rule for a full collection)."""
    return [[i] for i in range(len(gc.get_objects()) // 2 + 20_000)]


def test_cpython_collects_the_oldest_generation_when_long_lived_objects_grow(full_collections):
    """What the timer replaces (and what makes the next test able to fail)."""
    kept = long_lived_growth()
    assert 2 in full_collections and kept


def test_the_timer_collects_the_oldest_generation_and_cpython_no_longer_does(settings, full_collections):
    settings.WATCH_FULL_COLLECTION_SECONDS = 0.05
    thresholds = gc.get_threshold()

    async def scenario():
        collector.start()
        kept = long_lived_growth()            # no await: the timer cannot run meanwhile
        assert 2 not in full_collections and kept
        limit = Deadline(10)
        while full_collections.count(2) < 2:  # the timer's, again and again
            assert not limit.expired(), full_collections
            await asyncio.sleep(0.02)
        collector.stop()

    asyncio.run(scenario())
    assert gc.get_threshold() == thresholds


def test_none_when_it_is_set_to_zero(settings):
    settings.WATCH_FULL_COLLECTION_SECONDS = 0
    thresholds = gc.get_threshold()

    async def scenario():
        collector.start()
        return gc.get_threshold()

    assert asyncio.run(scenario()) == thresholds


def test_the_asgi_lifespan_starts_it_and_its_shutdown_stops_it(settings, full_collections):
    from storefront.asgi import application

    settings.WATCH_FULL_COLLECTION_SECONDS = 600
    thresholds, during, sent = gc.get_threshold(), [], []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive():
        if sent:                              # the startup was answered: what it set
            during.append(gc.get_threshold())
        return next(messages)

    async def send(message):
        sent.append(message["type"])

    asyncio.run(application({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert during == [(*thresholds[:2], collector._NEVER)]
    assert gc.get_threshold() == thresholds
