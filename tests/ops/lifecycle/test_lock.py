"""Exactly one lifecycle pass at a time, and host calls made once per lease.

Two real passes race on PostgreSQL (threads, each on its own connection) with the lock in
the database (never in Redis, which a second host may find flushed): one sweeps, the other returns "skipped" at once. A holder
killed with SIGKILL (a subprocess) blocks passes until its lock expires, then the next
pass runs. Two overlapping wipes / key destructions of the same leases call the host
once per lease.

The overlaps are made, not hoped for: the running pass waits in its start hook
until the other one has returned; the first host call waits until PostgreSQL shows the
other caller blocked on that lease's row. The tests assert the order of what happened,
never a duration."""
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.models import JobLock
from ops.lifecycle import SKIPPED, run_lifecycle, run_lifecycle_exclusive
from ops.lifecycle.locks import DatabaseLock, exclusive
from rental.agent import FakeAgent, agent_override
from rental.disk_keys import disk_key_complete_destroy
from rental.models import DiskKey, Lease, LeaseEvent, LeaseState
from rental.services import lease_wipe
from tests import deadlines
from tests.billing.celery_workers import database_url
from tests.billing.races import (
    another_connection_waits_for_my_locks,
    build_due_leases,
    in_threads,
    scenario,
    wait_until,
)
from tests.conftest import HAS_REDIS, ON_POSTGRES

S = LeaseState
BASE = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not ON_POSTGRES, reason="real concurrent passes need DATABASE_URL=postgres://…")]
BACKENDS = ["database", pytest.param("redis", marks=[
    pytest.mark.redis, pytest.mark.skipif(not HAS_REDIS, reason="needs REDIS_URL")])]


@pytest.fixture(params=BACKENDS)
def backend(request, settings):
    """With and without REDIS_URL, as in production and in the embedded default: the lock is
    the database's either way."""
    settings.REDIS_URL = os.environ["REDIS_URL"] if request.param == "redis" else ""
    return request.param


class Events:
    """What happened, in order, across threads."""

    def __init__(self):
        self.seen, self.mutex = [], threading.Lock()

    def __call__(self, what):
        with self.mutex:
            self.seen.append(what)


class CountingAgent(FakeAgent):
    """Counts host calls per lease. With `events`, its first call holds the lease's row until
    the other caller is seen waiting for it, so the two callers really overlap."""

    def __init__(self, events=None):
        self.calls, self.mutex, self.events = Counter(), threading.Lock(), events

    def _count(self, action, lease_id):
        with self.mutex:
            self.calls[(action, lease_id)] += 1
            first = sum(self.calls.values()) == 1
        if first and self.events:
            self.events(f"{action} {lease_id} started")
            waited = wait_until(another_connection_waits_for_my_locks)
            self.events("the other caller waits for the lease" if waited else "nobody waited")
            self.events(f"{action} {lease_id} done")

    def poll_ready(self, *, lease_id, started_at, now):
        self._count("poll", lease_id)
        return super().poll_ready(lease_id=lease_id, started_at=started_at, now=now)

    def destroy_key(self, *, lease_id, key_ref, at):
        self._count("destroy_key", lease_id)
        return super().destroy_key(lease_id=lease_id, key_ref=key_ref, at=at)

    def wipe(self, *, lease_id, at):
        self._count("wipe", lease_id)
        return super().wipe(lease_id=lease_id, at=at)


def test_second_concurrent_pass_is_skipped_at_once(catalog, settings, backend):
    settings.HOST_AGENT_FAKE_DELAY = 0
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    build_due_leases(20, t0, prefix=f"lock-{backend}")
    now = t0 + timedelta(minutes=1)  # twenty paid leases to provision (a term starts when it is ready)
    agent, events = CountingAgent(), Events()
    inside, second_done = threading.Event(), threading.Event()

    def holds_the_lock_until_the_second_returned(_now):
        events("first pass holds the lock")
        inside.set()
        events("first pass sweeps" if second_done.wait(30) else "the second pass never returned")

    def first():
        result = run_lifecycle_exclusive(now, on_start=holds_the_lock_until_the_second_returned)
        events("first pass done")
        return result

    def second():
        assert inside.wait(30), "the first pass never started"
        result = run_lifecycle_exclusive(now)
        events("second pass skipped" if result is None else "second pass ran too")
        second_done.set()
        return result

    with agent_override(agent):
        ran, skipped = in_threads(first, second)
    assert skipped is None and len(ran) == 20, (ran, skipped)
    assert events.seen == ["first pass holds the lock", "second pass skipped", "first pass sweeps",
                           "first pass done"]
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
import django, sys, time; from datetime import UTC, datetime, timedelta
django.setup()
from ops.lifecycle.locks import exclusive
with exclusive("lifecycle", ttl=timedelta(seconds=float(sys.argv[1]))) as held:
    print("held" if held else "not held", flush=True)
    time.sleep(120)
"""


def lock_expiry(backend) -> datetime:
    """When the lifecycle lock expires, as the database stores it."""
    return JobLock.objects.get(name="lifecycle").expires_at


def test_lock_of_a_killed_holder_expires(catalog, settings, backend):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "TESTING": "1",
           "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL, "PYTHONPATH": str(BASE)}
    # A ttl of 6 unloaded seconds: the holder's renewal (every ttl/3) must not be starved past
    # the ttl by a busy machine, or the lock is lost before the test kills the holder.
    ttl = deadlines.scaled(6)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, f"{ttl:.1f}"], cwd=BASE, env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        first_expiry = lock_expiry(backend)
        # The holder's renewal pushes the expiry back: past its first expiry it still holds.
        assert wait_until(lambda: timezone.now() > first_expiry and lock_expiry(backend) > timezone.now(),
                          timeout=3 * ttl)
        assert run_lifecycle_exclusive(timezone.now()) is None
        os.killpg(holder.pid, signal.SIGKILL)  # no release, no more renewals
        holder.wait(10)
        left_at = lock_expiry(backend)  # the expiry the killed holder left behind
        assert run_lifecycle_exclusive(timezone.now()) is None  # still held until then
        ran = wait_until(lambda: run_lifecycle_exclusive(timezone.now()) is not None,
                         timeout=(left_at - timezone.now()).total_seconds() + 5, every=0.1)
        ran_by = timezone.now()
        assert ran, "the killed holder's lock never expired"
        assert ran_by >= left_at  # and not before the expiry it left
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
    events = Events()
    agent = CountingAgent(events)

    def wipe_all():
        return sum(lease_wipe(lease_id=pk, now=wipe_at) for pk in released)

    with agent_override(agent):
        first, second = in_threads(wipe_all, wipe_all)
    assert first + second == 20, (first, second)
    assert events.seen == [f"wipe {released[0]} started", "the other caller waits for the lease",
                           f"wipe {released[0]} done"]
    assert agent.calls == Counter({("wipe", pk): 1 for pk in released})
    assert LeaseEvent.objects.filter(kind="wiped").count() == 20


def test_overlapping_key_destructions_call_the_host_once_per_lease(catalog, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    released, _ = released_unwiped("key")
    DiskKey.objects.filter(lease_id__in=released).update(state=DiskKey.State.DESTROY_REQUESTED)
    events = Events()
    agent = CountingAgent(events)
    now = timezone.now()

    def destroy_all():
        return sum(disk_key_complete_destroy(lease_id=pk, now=now) for pk in released)

    with agent_override(agent):
        first, second = in_threads(destroy_all, destroy_all)
    assert first + second == 20, (first, second)
    assert events.seen == [f"destroy_key {released[0]} started", "the other caller waits for the lease",
                           f"destroy_key {released[0]} done"]
    assert agent.calls == Counter({("destroy_key", pk): 1 for pk in released})
