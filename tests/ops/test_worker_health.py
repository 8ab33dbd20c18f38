"""The jobs worker is healthy only while its work is done: `manage.py healthcheck worker` fails,
naming the job, when the lifecycle pass or a configured coin's watcher last completed longer ago
than JOB_STALE_AFTER_INTERVALS of its interval, even though the worker answers its ping; each
pass writes its own completion; the ops dashboard shows each one's age and the same limit."""
import re
import socket
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing.models import JobRun
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, ScanResult
from billing.tasks import watch_payments
from ops.tasks import lifecycle_tick
from storefront import celery_app

NODE = f"jobs@{socket.gethostname()}"


class QuietLtc:
    coin, required_confirmations = Coin.LTC, 6

    def scan(self, watch, cursor):
        return ScanResult([], {"height": 7}, [])


class DownBtc:
    coin, required_confirmations = Coin.BTC, 2

    def scan(self, watch, cursor):
        raise ConnectionRefusedError("node down")


@pytest.fixture
def answering(monkeypatch):
    """The jobs worker answers its ping (the real ping runs against the stack in tests/deploy)."""
    pinged = []

    def ping(destination, timeout):
        pinged.append(destination)
        return [{node: {"ok": "pong"}} for node in destination]

    monkeypatch.setattr(celery_app.control, "ping", ping)
    return pinged


@pytest.fixture
def coins():
    with coins_config.use_adapters({Coin.LTC: QuietLtc(), Coin.BTC: DownBtc()}):
        yield


def healthcheck() -> str:
    out = StringIO()
    call_command("healthcheck", "worker", stdout=out)
    return out.getvalue()


def completed(name: str, seconds_ago: float):
    at = timezone.now() - timedelta(seconds=seconds_ago)
    JobRun.objects.update_or_create(name=name, defaults={"last_started_at": at - timedelta(seconds=1),
                                                         "last_finished_at": at})


def test_fresh_passes_are_healthy(db, answering, coins):
    completed("lifecycle", 100)  # the lifecycle ticks every 60 s: 180 s allowed
    completed("watch_payments:LTC", 60)  # the watchers every 30 s: 90 s allowed
    completed("watch_payments:BTC", 5)
    out = healthcheck()
    assert answering == [[NODE]]
    # (ages to the second: \d for the moments between writing the rows and reading them on a busy machine)
    assert re.fullmatch(f"worker: {re.escape(NODE)} answered; lifecycle: last completed 10\\d s ago \\(allowed 180 s\\); "
                        "watch_payments:BTC: last completed \\d s ago \\(allowed 90 s\\); "
                        "watch_payments:LTC: last completed 6\\d s ago \\(allowed 90 s\\)", out.strip()), out


@pytest.mark.parametrize("stale, why", [
    ("lifecycle", r"lifecycle: last completed 20\d s ago \(allowed 180 s\)"),
    ("watch_payments:BTC", r"watch_payments:BTC: last completed 20\d s ago \(allowed 90 s\)"),
])
def test_a_stale_pass_makes_the_answering_worker_unhealthy_and_is_named(db, answering, coins, stale, why):
    for name in ("lifecycle", "watch_payments:LTC", "watch_payments:BTC"):
        completed(name, 200 if name == stale else 10)
    with pytest.raises(CommandError) as failed:
        healthcheck()
    assert re.fullmatch(f"worker: {re.escape(NODE)} answered, but its work is late: {why}", str(failed.value)), failed.value


def test_a_pass_that_never_completed_and_a_silent_worker_are_unhealthy(db, answering, coins, monkeypatch, settings):
    completed("lifecycle", 10)
    with pytest.raises(CommandError, match=r"late: watch_payments:BTC: never completed \(allowed 90 s\); "
                                           r"watch_payments:LTC: never completed"):
        healthcheck()
    settings.JOB_STALE_AFTER_INTERVALS = 0.1  # the limit is the setting: 6 s for the lifecycle
    completed("watch_payments:LTC", 1)
    completed("watch_payments:BTC", 1)
    with pytest.raises(CommandError, match=r"late: lifecycle: last completed 1\d s ago \(allowed 6 s\)$"):
        healthcheck()
    monkeypatch.setattr(celery_app.control, "ping", lambda destination, timeout: [])
    with pytest.raises(CommandError, match=f"^worker: no ping reply from {re.escape(NODE)}$"):
        healthcheck()


def test_each_pass_records_its_own_completion(db, answering, coins, catalog):
    """The rows the healthcheck reads are written by the passes themselves, a coin's watcher
    even when its node failed (the node's failure is the coin's health, on the dashboard)."""
    with pytest.raises(CommandError, match="lifecycle: never completed"):
        healthcheck()
    before = timezone.now()
    lifecycle_tick()
    result = watch_payments()
    assert result["LTC"] == 0 and "node down" in result["BTC"]
    rows = {r.name: r for r in JobRun.objects.filter(last_finished_at__gte=before)}
    assert set(rows) == {"lifecycle", "watch_payments", "watch_payments:LTC", "watch_payments:BTC"}
    assert rows["watch_payments:LTC"].last_result == {"quotes": 0}
    assert rows["watch_payments:BTC"].last_result == {"error": "ConnectionRefusedError: node down"}
    assert re.match(f"worker: {re.escape(NODE)} answered; lifecycle: last completed \\d s ago", healthcheck())


def test_the_dashboard_shows_each_jobs_age_and_limit(client, operator, answering, coins):
    completed("lifecycle", 200)
    completed("watch_payments:LTC", 42)
    client.force_login(operator)
    page = client.get("/admin/ops/dashboard/").content.decode()
    assert re.search(r'<td class="job-age">20\d s \(≤ 180 s\)</td>', page)
    assert re.search(r'<td class="job-age">4\d s \(≤ 90 s\)</td>', page)
    assert '<td class="job-age">— (≤ 90 s)</td>' in page  # BTC's watcher: never completed
    assert "Job lifecycle: late: last completed 3 min ago (expected within 3 min)" in page
    assert "Job watch_payments:BTC: never ran: is celery beat running?" in page
