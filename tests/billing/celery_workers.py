"""Real Celery workers for the tests that run tasks out of process: a worker subprocess on a
queue of its own (the `queue` fixture is in tests/conftest.py), the test database's URL for
it, and a batch of leases due for renewal."""
import os
import signal
import subprocess
import sys
from pathlib import Path

from django.db import connection
from django.test import override_settings

from inventory.models import Site
from rental.lifecycle import sweep_provisioning
from tests import deadlines
from tests.billing.races import PRICE, order
from tests.factories import new_customer

BASE = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))


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
