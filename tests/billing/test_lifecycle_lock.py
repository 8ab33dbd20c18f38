"""issue 14: exactly one lifecycle pass at a time, and host calls made once per lease.

Two real passes race on PostgreSQL (threads, each on its own connection) with the lock in
the database and in Redis: one sweeps, the other returns "skipped" at once. A holder
killed with SIGKILL (a subprocess) blocks passes until its lock expires, then the next
pass runs. Two overlapping wipes / key destructions of the same leases call the host
once per lease."""
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.lifecycle import SKIPPED, run_lifecycle, run_lifecycle_exclusive
from billing.locks import DatabaseLock, RedisLock, exclusive, lock_backend
from rental.agent import FakeAgent, agent_override
from rental.models import DiskKey, Lease, LeaseEvent, LeaseState
from rental.services import disk_key_complete_destroy, lease_wipe
from tests.billing.test_celery_worker import database_url
from tests.billing.test_concurrency import build_due_leases, in_threads, scenario
from tests.conftest import HAS_REDIS, ON_POSTGRES

S = LeaseState
BASE = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not ON_POSTGRES, reason="real concurrent passes need DATABASE_URL=postgres://…")]
BACKENDS = ["database", pytest.param("redis", marks=[
    pytest.mark.redis, pytest.mark.skipif(not HAS_REDIS, reason="needs REDIS_URL")])]


@pytest.fixture(params=BACKENDS)
def backend(request, settings):
    """The lock backend under test: settings.REDIS_URL selects Redis, as in production."""
    settings.REDIS_URL = os.environ["REDIS_URL"] if request.param == "redis" else ""
    if request.param == "redis":
        lock_backend().client.delete(RedisLock.key("lifecycle"))  # a stale key from an earlier run
    yield request.param
    if request.param == "redis":
        lock_backend().client.delete(RedisLock.key("lifecycle"))


class CountingAgent(FakeAgent):
    """Counts host calls per lease; slow enough that overlapping callers really overlap."""

    def __init__(self, delay=0.0):
        self.delay, self.calls, self.mutex = delay, Counter(), threading.Lock()

    def _count(self, action, lease_id):
        with self.mutex:
            self.calls[(action, lease_id)] += 1
        time.sleep(self.delay)

    def poll_ready(self, *, lease_id, started_at, now):
        self._count("poll", lease_id)
        return super().poll_ready(lease_id=lease_id, started_at=started_at, now=now)

    def destroy_key(self, *, lease_id, key_ref, at):
        self._count("destroy_key", lease_id)
        return super().destroy_key(lease_id=lease_id, key_ref=key_ref, at=at)

    def wipe(self, *, lease_id, at):
        self._count("wipe", lease_id)
        return super().wipe(lease_id=lease_id, at=at)


def timed(target):
    def run():
        started = time.monotonic()
        return target(), time.monotonic() - started
    return run


def test_second_concurrent_pass_is_skipped_at_once(catalog, settings, backend):
    settings.HOST_AGENT_FAKE_DELAY = 0
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    build_due_leases(20, t0, prefix=f"lock-{backend}")
    now = t0 + timedelta(minutes=1)  # twenty paid leases to provision (a term starts when it is ready)
    agent = CountingAgent(delay=0.05)  # 20 polls: the pass takes at least a second

    with agent_override(agent):
        first, second = in_threads(timed(lambda: run_lifecycle_exclusive(now)),
                                   timed(lambda: run_lifecycle_exclusive(now)))
    assert not isinstance(first, BaseException) and not isinstance(second, BaseException), (first, second)
    (ran, ran_secs), (skipped, skipped_secs) = sorted([first, second], key=lambda r: r[0] is None)
    assert skipped is None and len(ran) == 20, (first, second)
    assert ran_secs >= 1.0 and skipped_secs < ran_secs / 3, (ran_secs, skipped_secs)
    assert set(agent.calls.values()) == {1} and len(agent.calls) == 20  # each lease polled once
    kinds = Counter(LeaseEvent.objects.values_list("kind", flat=True))
    assert kinds["provisioned"] == 20
    # The lock was released: the next pass runs (and finds nothing left to do).
    assert run_lifecycle_exclusive(now) == []


def test_command_reports_skipped_while_a_pass_runs(catalog, settings, backend, capsys):
    with exclusive("lifecycle", ttl=timedelta(seconds=30)) as held:
        assert held
        call_command("lifecycle")
        assert capsys.readouterr().out.strip() == SKIPPED
    call_command("lifecycle")
    assert "transition(s) made" in capsys.readouterr().out


HOLD_AND_WAIT = """
import django, sys, time; from datetime import timedelta
django.setup()
from billing.locks import exclusive
with exclusive("lifecycle", ttl=timedelta(seconds=float(sys.argv[1]))) as held:
    print("held" if held else "not held", flush=True)
    time.sleep(120)
"""


def test_lock_of_a_killed_holder_expires(catalog, settings, backend):
    ttl = 3.0
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rental.test_settings", "TESTING": "1",
           "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "PYTHONPATH": str(BASE)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, str(ttl)], cwd=BASE, env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        time.sleep(ttl * 1.5)  # longer than the ttl: the holder's renewal keeps it
        assert run_lifecycle_exclusive(timezone.now()) is None
        os.killpg(holder.pid, signal.SIGKILL)  # no release, no more renewals
        killed_at = time.monotonic()
        holder.wait(10)
        assert run_lifecycle_exclusive(timezone.now()) is None  # still held until it expires
        while (result := run_lifecycle_exclusive(timezone.now())) is None:
            assert time.monotonic() - killed_at < ttl + 5, "the killed holder's lock never expired"
            time.sleep(0.2)
        assert result == [] and time.monotonic() - killed_at >= ttl / 3
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)


def test_database_lock_release_needs_the_holders_token(db):
    lock = DatabaseLock()
    assert lock.acquire("job", "a", timedelta(seconds=30))
    assert not lock.acquire("job", "b", timedelta(seconds=30))
    assert not lock.release("job", "b") and lock.release("job", "a")
    assert lock.acquire("job", "b", timedelta(seconds=30))


class WipeLaterAgent(FakeAgent):
    """Destroys keys but has not proven any wipe yet: released leases wait to be wiped."""

    def wipe(self, *, lease_id, at):
        return None


def released_unwiped(prefix):
    """Twenty released leases whose keys are destroyed and whose wipe is due (scenario())."""
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=40)
    _leases, passes = scenario(t0, prefix)
    with agent_override(WipeLaterAgent()):
        for at in passes:
            run_lifecycle(at)
    released = list(Lease.objects.filter(state=S.RELEASED).values_list("pk", flat=True))
    assert len(released) == 20
    return released, passes[-1]


def test_overlapping_wipes_call_the_host_once_per_lease(catalog, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    released, wipe_at = released_unwiped("wipe")
    agent = CountingAgent(delay=0.02)

    def wipe_all():
        return sum(lease_wipe(lease_id=pk, now=wipe_at) for pk in released)

    with agent_override(agent):
        first, second = in_threads(wipe_all, wipe_all)
    assert first + second == 20, (first, second)
    assert agent.calls == Counter({("wipe", pk): 1 for pk in released})
    assert LeaseEvent.objects.filter(kind="wiped").count() == 20


def test_overlapping_key_destructions_call_the_host_once_per_lease(catalog, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    released, _ = released_unwiped("key")
    DiskKey.objects.filter(lease_id__in=released).update(state=DiskKey.State.DESTROY_REQUESTED)
    agent = CountingAgent(delay=0.02)
    now = timezone.now()

    def destroy_all():
        return sum(disk_key_complete_destroy(lease_id=pk, now=now) for pk in released)

    with agent_override(agent):
        first, second = in_threads(destroy_all, destroy_all)
    assert first + second == 20, (first, second)
    assert agent.calls == Counter({("destroy_key", pk): 1 for pk in released})
