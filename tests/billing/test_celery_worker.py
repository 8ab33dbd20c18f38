"""`billing.lifecycle_tick` on a real Celery worker (subprocess, --pool=solo) over Redis,
against the test database on PostgreSQL: two ticks on two workers transition each lease
once; a worker SIGKILLed mid-task leaves the message unacknowledged (acks_late), a new
worker gets it again after the visibility timeout, and the end state equals a clean run."""
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from billing.models import Invoice, JobRun, LedgerEntry
from inventory.models import Site
from ops.lifecycle import run_lifecycle
from rental.lifecycle import sweep_provisioning
from rental.models import Lease, LeaseEvent, LeaseState
from tests import deadlines
from tests.billing.races import PRICE, order, summary
from tests.factories import new_customer

S = LeaseState
BASE = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))

pytestmark = [
    pytest.mark.redis,  # PostgreSQL + Redis: the worker shares the test DB (tests/conftest.py)
    pytest.mark.django_db(transaction=True),
]


def database_url() -> str:
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class Worker:
    def __init__(self, name: str, queue: str, log: Path, **env):
        self.name, self.log = name, log
        environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "TESTING": "1",
                   "CELERY_TASK_ALWAYS_EAGER": "0", "DATABASE_URL": database_url(), "DB_CONN_MAX_AGE": "0",
                   "HOST_AGENT_FAKE_DELAY": "0", "PYTHONPATH": str(BASE), **env}
        self.out = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [CELERY, "-A", "storefront", "worker", "--pool=solo", "-Q", queue, "-n", f"{name}-{queue}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info"],
            cwd=BASE, env=environ, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout=20):
        wait_for(lambda: "ready." in self.text() or self.proc.poll() is not None, timeout, f"{self.name} start")
        assert self.proc.poll() is None, self.text()

    def succeeded(self) -> int:
        return self.text().count("succeeded in")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.out.close()


def wait_for(condition, timeout, what):
    return deadlines.wait_for(condition, timeout, what, every=0.2)


@pytest.fixture
def queue():
    """A queue of our own on the shared Redis database, so parallel runs never meet."""
    name = f"lifecycle-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # not the current app: the storefront's tasks queued later in this process (eager in tests) must
    # not be sent through this sender to a queue no worker reads
    app = Celery("test-sender", broker=os.environ["REDIS_URL"], set_as_current=False)
    yield name, app
    with app.connection_for_write() as conn:
        conn.default_channel.client.delete(name)
    app.close()


def due_leases(n, t0, prefix):
    """n leases paid and provisioned at t0 (in process, with the fake agent's delay at 0),
    so their first term ends at t0 + 7 days; a third can auto-renew from balance."""
    sites = list(Site.objects.all())
    leases = []
    for i in range(n):
        customer = new_customer(f"{prefix}{i}", balance=(2 if i % 3 == 0 else 1) * PRICE, now=t0)
        leases.append(order(customer, t0, site=sites[i % len(sites)])[0])
    with override_settings(HOST_AGENT_FAKE_DELAY=0):
        assert len(sweep_provisioning(t0)) == n
    return leases


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
