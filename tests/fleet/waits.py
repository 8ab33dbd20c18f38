"""Running the nodes' held waits (fleet/desired_watch.py) in tests: in a thread of their own,
as a server runs a request, and as the ASGI process serves them, with something done once
they wait."""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings

from fleet import desired_watch
from tests.deadlines import Deadline


def in_own_thread(call):
    """`call()` in a thread of its own, as a server runs a request: an earlier test in this
    worker (a browser test's sync Playwright) may have left an event loop running in the
    test's thread, where async_to_sync refuses to run."""
    from django.db import connections

    def run():
        try:
            return call()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def held(view, request, *, while_waiting=None):
    """`view(request)` as the ASGI process runs it (its own event loop), with `while_waiting`
    run (in the test's thread, like any other request) once the request waits on the bell.
    Returns the response and how long it took."""
    async def scenario():
        started = time.monotonic()
        answer = asyncio.create_task(view(request))
        if while_waiting is not None:
            await until_it_waits(answer, lambda: answer.result().content)
            await sync_to_async(while_waiting)()
        response = await answer
        return response, time.monotonic() - started

    async def in_its_pool():
        return await in_a_pool_of_one(scenario())

    return in_own_thread(async_to_sync(in_its_pool))


async def until_it_waits(answer: asyncio.Future, said) -> None:
    """Returns once a request waits on the bell; fails if `answer` ends first (with `said()`)
    or after 10 s."""
    limit = Deadline(10)
    while desired_watch.bell.count() == 0:
        assert not answer.done(), said()
        assert not limit.expired(), "the request never started waiting"
        await asyncio.sleep(0.01)


async def in_a_pool_of_one(awaitable):
    """`awaitable` with its loop's pool one thread, whose connections are closed at the end,
    as are the reports' threads' (fleet.views.report_threads): the ASGI process keeps its
    threads and their connections, a test does not, and a connection left open keeps the
    test database from being dropped."""
    from django.db import connections

    from fleet.views import report_threads

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    try:
        return await awaitable
    finally:
        await loop.run_in_executor(None, connections.close_all)
        # the reports' own thread (NODE_WATCH_REPORT_THREADS is 1 here), kept by the process
        assert settings.NODE_WATCH_REPORT_THREADS == 1
        await loop.run_in_executor(report_threads(), connections.close_all)
