"""`billing.watch_payments` on a real Celery worker over Redis, SIGKILLed in the middle of a
payment scan (acks_late): the message comes back after the visibility timeout, a fresh
worker reruns the scan, and the end state equals one clean scan — every quote settled once,
one payment row per (coin, txid, output), every invoice paid once, nobody credited twice.
The lifecycle-sweep variant is tests/ops/lifecycle/test_celery_worker.py; both use the Worker of
tests/billing/celery_workers.py."""
import os
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Invoice, JobRun, LedgerEntry, Payment, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin
from billing.payments.services import quote_create, watch_coin
from tests.billing.celery_workers import BASE, CELERY, Worker, database_url, wait_for
from tests.billing.payments_helpers import offline_adapters, set_rate
from tests.billing.races import order
from tests.factories import new_customer
from tests.faults.scan_worker import PayEverything

pytestmark = [
    pytest.mark.redis,  # PostgreSQL + Redis: the worker shares the test DB (tests/conftest.py)
    pytest.mark.django_db(transaction=True),
]
N = 12


@pytest.fixture
def scan_queue(queue):
    """The scan worker's Redis queue of its own (tests/conftest.py's `queue`)."""
    return queue


class ScanWorker(Worker):
    """celery_workers' Worker, running the app in tests/faults/scan_worker.py."""

    def __init__(self, name, queue_name, log, **env):
        environ = {**os.environ, "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "TESTING": "1",
                   "CELERY_TASK_ALWAYS_EAGER": "0", "DATABASE_URL": database_url(), "DB_CONN_MAX_AGE": "0",
                   "PYTHONPATH": str(BASE), **env}
        self.name, self.log = name, log
        self.out = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [CELERY, "-A", "tests.faults.scan_worker", "worker", "--pool=solo", "-Q", queue_name, "-n",
             f"{name}-{queue_name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info"],
            cwd=BASE, env=environ, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)


def open_quotes(prefix: str, now):
    with coins_config.use_adapters(offline_adapters()):
        quotes = []
        for i in range(N):
            invoice = order(new_customer(f"{prefix}{i}", now=now), now, site=_site(i), pay=False)[1]
            quotes.append(quote_create(invoice=invoice, coin="LTC", now=now))
    return quotes


def _site(i):
    from inventory.models import Site

    sites = list(Site.objects.order_by("code"))
    return sites[i % len(sites)]


def outcome(quotes):
    rows = []
    for quote in quotes:
        quote.refresh_from_db()
        invoice = Invoice.objects.get(pk=quote.invoice_id)
        rows.append((quote.state, quote.exception, Payment.objects.filter(quote=quote).count(),
                     tuple(Payment.objects.filter(quote=quote).values_list("state", flat=True)),
                     invoice.state, invoice.paid_via,
                     tuple(LedgerEntry.objects.filter(account__customer_id=invoice.customer_id).order_by("id")
                           .values_list("kind", "amount_cents"))))
    return rows


def test_worker_killed_mid_scan_is_redelivered_and_ends_like_a_clean_scan(catalog, scan_queue, tmp_path):
    name, sender = scan_queue
    now = timezone.now()
    set_rate("LTC", "100", now - timedelta(minutes=1))
    killed = open_quotes("k", now)
    env = {"CELERY_VISIBILITY_TIMEOUT": "4"}
    slow = ScanWorker("slow", name, tmp_path / "slow.log", SCAN_APPLY_DELAY="1", **env)  # 9 s to kill it mid-scan
    fresh = None
    try:
        slow.wait_ready()
        sender.send_task("billing.watch_payments", args=[["LTC"]], queue=name)
        wait_for(lambda: Quote.objects.filter(pk__in=[q.pk for q in killed], state="settled").count() >= 3, 30,
                 "the slow scan to settle a few quotes")
        slow.kill()  # SIGKILL mid-scan: no ack, cursor not saved
        done = Quote.objects.filter(pk__in=[q.pk for q in killed], state="settled").count()
        assert 3 <= done < N, done
        fresh = ScanWorker("fresh", name, tmp_path / "fresh.log", **env)
        fresh.wait_ready()
        wait_for(lambda: fresh.succeeded() >= 1, 30, "the redelivered scan")  # no new send
    finally:
        slow.kill()
        slow.stop()
        if fresh:
            fresh.stop()
    assert "billing.watch_payments" in fresh.text()
    assert JobRun.objects.get(name="watch_payments").last_finished_at is not None
    result = outcome(killed)

    clean = open_quotes("c", timezone.now())  # the same scenario, one clean scan in process
    with coins_config.use_adapters({Coin.LTC: PayEverything(offline_adapters()[Coin.LTC])}):
        watch_coin(coin="LTC", now=timezone.now())
    assert result == outcome(clean)
    assert {row[0] for row in result} == {"settled"} and {row[4] for row in result} == {"paid"}
    assert Payment.objects.count() == 2 * N  # one per (coin, txid, output), the rerun added none
