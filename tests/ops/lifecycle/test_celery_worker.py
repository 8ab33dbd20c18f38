"""`billing.lifecycle_tick` on a real Celery worker (subprocess, --pool=solo) over Redis,
against the test database on PostgreSQL: two ticks on two workers transition each lease
once; a worker SIGKILLed mid-task leaves the message unacknowledged (acks_late), a new
worker gets it again after the visibility timeout, and the end state equals a clean run."""
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Invoice, JobRun, LedgerEntry
from ops.lifecycle import run_lifecycle
from rental.models import Lease, LeaseEvent, LeaseState
from tests.billing.celery_workers import Worker, due_leases, wait_for
from tests.billing.races import summary

S = LeaseState

pytestmark = [
    pytest.mark.redis,  # PostgreSQL + Redis: the worker shares the test DB (tests/conftest.py)
    pytest.mark.django_db(transaction=True),
]


def outcome(leases, t0):
    """summary() with the hold and wipe deadlines measured from each lease's own stop: they
    count from the moment the worker's pass stopped it, which a test cannot pin."""
    rows = summary(leases, t0)
    return [(row[0], row[1], *((lease.hold_until - lease.suspended_at, lease.wipe_by - lease.suspended_at)
                               if lease.suspended_at else (None, None)), *row[4:])
            for lease, row in zip(leases, rows, strict=True)]


def test_two_ticks_on_two_workers_transition_each_lease_once(catalog, queue, tmp_path):
    name, sender = queue
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=8)
    leases = due_leases(21, t0, "w")
    env = {"HOST_AGENT": "tests.billing.slow_agent.SlowAgent", "SLOW_AGENT_SECONDS": "0.05"}
    workers = [Worker(f"w{i}", name, tmp_path / f"w{i}.log", **env) for i in (1, 2)]
    try:
        for worker in workers:
            worker.wait_ready()
        sender.send_task("billing.lifecycle_tick", queue=name)
        sender.send_task("billing.lifecycle_tick", queue=name)
        wait_for(lambda: sum(w.succeeded() for w in workers) == 2, 30, "both ticks")
    finally:
        for worker in workers:
            worker.stop()
    kinds = Counter(LeaseEvent.objects.values_list("kind", flat=True))
    assert kinds == Counter({"created": 21, "paid": 21, "provisioned": 21, "extended": 7, "suspended": 14})
    assert Invoice.objects.filter(kind="renewal").count() == 21
    assert LedgerEntry.objects.filter(kind="renewal").count() == 7
    assert Counter(Lease.objects.values_list("state", flat=True)) == {S.ACTIVE: 7, S.SUSPENDED: 14}
    assert JobRun.objects.get(name="lifecycle").last_finished_at is not None
    assert {lease.pk for lease in leases} == set(Lease.objects.values_list("pk", flat=True))


def test_worker_killed_mid_task_is_redelivered_and_ends_like_a_clean_run(catalog, queue, tmp_path, settings):
    name, sender = queue
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=8)
    crashed = due_leases(24, t0, "k")
    # The killed worker's lifecycle lock expires 1.5 s after its last renewal,
    # before the fresh worker has started, so the redelivered tick runs instead of skipping.
    slow = Worker("slow", name, tmp_path / "slow.log", HOST_AGENT="tests.billing.slow_agent.SlowAgent",
                  SLOW_AGENT_SECONDS="0.4", CELERY_VISIBILITY_TIMEOUT="4", LIFECYCLE_LOCK_SECONDS="1.5")
    fresh = None
    try:
        slow.wait_ready()
        sender.send_task("billing.lifecycle_tick", queue=name)
        wait_for(lambda: Lease.objects.filter(state=S.SUSPENDED).count() >= 3, 20, "the slow tick to get going")
        slow.kill()  # SIGKILL mid-task (stopping instances): no ack, no clean-up
        done = Lease.objects.filter(state=S.SUSPENDED).count()
        # A pass commits its transitions per batch, so the kill may land after the
        # whole batch committed (16) or between batches; either way the end state below must
        # be a clean run's.
        assert 3 <= done <= 16, done
        assert JobRun.objects.get(name="lifecycle").last_finished_at is None
        fresh = Worker("fresh", name, tmp_path / "fresh.log", CELERY_VISIBILITY_TIMEOUT="4")
        fresh.wait_ready()
        # No new send: the unacknowledged message comes back by itself.
        wait_for(lambda: fresh.succeeded() >= 1, 25, "the redelivered tick")
    finally:
        slow.kill()
        slow.stop()
        if fresh:
            fresh.stop()
    assert "billing.lifecycle_tick" in fresh.text()
    assert JobRun.objects.get(name="lifecycle").last_finished_at is not None, fresh.text()[-4000:]
    result = outcome(crashed, t0)

    # A fresh copy of the same scenario, one clean pass in process, compared relative to its start.
    settings.HOST_AGENT_FAKE_DELAY = 0
    t1 = timezone.now().replace(microsecond=0) - timedelta(days=8)
    clean = due_leases(24, t1, "c")
    # touches only the fresh copy: renewal invoices, suspensions and their notices
    assert len(run_lifecycle(timezone.now())) == 24 + 16 + 16
    assert result == outcome(clean, t1)
    assert Counter(row[0] for row in result) == {S.ACTIVE: 8, S.SUSPENDED: 16}
