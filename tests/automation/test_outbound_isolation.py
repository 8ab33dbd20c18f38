"""Work is isolated by kind, on the processes production runs: `scripts/start.sh worker`,
`outbound` and `beat` (Redis, the test database on PostgreSQL), on queues of this test's own.
Four customers' endpoints trickle their answers a byte every half second, with two deliveries
each: the outbound worker's two slots stay busy for many seconds, every attempt is cut at
WEBHOOK_ATTEMPT_DEADLINE_SECONDS, no account has two attempts in flight, no delivery is attempted
twice though every lifecycle pass queues it again — and all the while the lifecycle pass, which
queued those deliveries, keeps completing every LIFECYCLE_INTERVAL_SECONDS on the jobs worker."""
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from billing.models import JobRun
from rental.notifications import services as notifications
from rental.notifications.models import WebhookDelivery
from rental.notifications.services import event_emit, webhook_endpoint_save
from rental.services import account_create
from tests.billing.celery_workers import database_url
from tests.deadlines import scaled, wait_for

from .drip import Drip, max_overlap

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

BASE = Path(__file__).resolve().parents[2]
INTERVAL = 1.0    # LIFECYCLE_INTERVAL_SECONDS
DEADLINE = 3.0    # WEBHOOK_ATTEMPT_DEADLINE_SECONDS; the receivers send a byte every 0.5 s
ACCOUNTS, PER_ACCOUNT = 4, 2


class Process:
    def __init__(self, role: str, env: dict, log: Path):
        self.role, self.log = role, log
        self.out = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(["scripts/start.sh", role], cwd=BASE, env=env, stdout=self.out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(scaled(10))
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.out.close()


def completions(since: datetime) -> list[datetime]:
    row = JobRun.objects.filter(name="lifecycle", last_finished_at__gte=since).values_list("last_finished_at",
                                                                                            flat=True).first()
    return [row] if row else []


def test_stuck_webhook_receivers_never_stall_the_lifecycle_pass(queue, tmp_path, monkeypatch):  # noqa: F811
    name, sender = queue
    jobs, outbound = f"{name}-jobs", f"{name}-outbound"
    drip = Drip(every=0.5)
    monkeypatch.setattr(notifications, "_queue", lambda *a, **kw: None)  # here: only the workers attempt
    t0 = timezone.now()
    for i in range(ACCOUNTS):
        customer = account_create(username=f"hook{i}", password="correct horse battery 9")
        webhook_endpoint_save(customer=customer, url=f"{drip.url}/{customer.username}")
        for j in range(PER_ACCOUNT):
            event_emit(event="webhook.test", term=f"t{j}", customer=customer, data={}, now=t0)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "TESTING": "1", "CELERY_TASK_ALWAYS_EAGER": "0",
           "DATABASE_URL": database_url(), "DB_CONN_MAX_AGE": "0", "VAR_DIR": str(tmp_path / "var"),
           "JOBS_QUEUE": jobs, "OUTBOUND_QUEUE": outbound, "CELERY_CONCURRENCY": "1", "OUTBOUND_CONCURRENCY": "2",
           "LIFECYCLE_INTERVAL_SECONDS": str(INTERVAL), "WEBHOOK_ATTEMPT_DEADLINE_SECONDS": str(DEADLINE),
           "WEBHOOK_CONCURRENCY_PER_ACCOUNT": "1", "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "1",
           "WEBHOOK_RETRY_SECONDS": "3600"}  # one attempt each within the test
    processes = [Process(role, env, tmp_path / f"{role}.log") for role in ("worker", "outbound", "beat")]
    seen: set[datetime] = set()

    def lifecycle_seen():
        seen.update(completions(t0))
        return True

    def everything_attempted():
        lifecycle_seen()
        return WebhookDelivery.objects.filter(attempts=0).count() == 0 and not drip.open_now()

    def logs() -> str:
        return "\n".join(f"--- {p.role}\n{p.text()[-3000:]}" for p in processes)

    try:
        wait_for(lambda: drip.snapshot(), 120, "the first webhook attempt (workers and beat starting)",
                 alive=[p.proc for p in processes], detail=logs)
        wait_for(everything_attempted, 60 + ACCOUNTS * PER_ACCOUNT * DEADLINE, "every delivery's attempt",
                 every=0.1, alive=[p.proc for p in processes], detail=logs)
    finally:
        drip.close()
        for process in reversed(processes):
            process.stop()
        with sender.connection_for_write() as conn:
            conn.default_channel.client.delete(jobs, outbound)

    connections = drip.snapshot()
    deliveries = WebhookDelivery.objects.all()
    # Each delivery attempted exactly once, every attempt cut at the deadline.
    assert sorted(c.webhook_id for c in connections) == sorted(str(d.delivery_id) for d in deliveries)
    assert {d.last_error for d in deliveries} == {"deadline: no complete answer within 3 s"}
    durations = [c.closed - c.opened for c in connections]
    assert all(c.closed_by_client for c in connections)
    assert DEADLINE - 0.5 < min(durations) and max(durations) < DEADLINE + scaled(1.5), durations
    # Both outbound slots were busy at once, never two for one account.
    assert max_overlap(connections) == 2
    assert max_overlap(connections, key=lambda c: c.path) == 1
    # Meanwhile the lifecycle pass kept its interval: from the first attempt to the last one's
    # end (about ACCOUNTS * PER_ACCOUNT / 2 * DEADLINE = 12 s), no gap between passes was longer
    # than the interval and a margin for a loaded machine.
    busy = (datetime.fromtimestamp(min(c.opened for c in connections), UTC),
            datetime.fromtimestamp(max(c.closed for c in connections), UTC))
    assert busy[1] - busy[0] > timedelta(seconds=2 * DEADLINE), busy
    passes = sorted(seen)
    inside = [busy[0]] + [p for p in passes if busy[0] < p < busy[1]] + [busy[1]]
    gaps = [(b - a).total_seconds() for a, b in zip(inside, inside[1:], strict=False)]
    print(f"\nattempts cut after {min(durations):.2f}-{max(durations):.2f} s (deadline {DEADLINE:g} s); "
          f"receivers busy {(busy[1] - busy[0]).total_seconds():.1f} s; lifecycle passes in it: {len(inside) - 2}, "
          f"longest gap {max(gaps):.2f} s (interval {INTERVAL:g} s)")
    assert max(gaps) < INTERVAL + scaled(1.5), (gaps, passes)
    assert len(inside) - 2 >= (busy[1] - busy[0]).total_seconds() / (INTERVAL + scaled(1.5)), (gaps, passes)
