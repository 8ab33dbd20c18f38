"""A customer's endpoint cannot hold a delivery attempt, a delivery or the outbound worker: every
attempt ends at WEBHOOK_ATTEMPT_DEADLINE_SECONDS whatever the receiver does (a byte every half
second keeps each read alive, so only the deadline can end it), a delivery has one attempt in
flight (its lease outlasts the deadline; the sweep and a duplicate message leave it alone), and an
account has at most WEBHOOK_CONCURRENCY_PER_ACCOUNT attempts in flight. Against local dripping
receivers (tests/automation/drip.py), in process; the real workers are in
test_outbound_isolation.py."""
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.core import checks
from django.utils import timezone

from rental.notifications import services as notifications
from rental.notifications.models import WebhookDelivery
from rental.notifications.sending import post
from rental.notifications.services import (
    BUSY,
    event_emit,
    sweep_webhooks,
    webhook_deliver,
    webhook_endpoint_save,
)
from tests.deadlines import scaled, wait_for

from .drip import SLOW_BODY, SLOW_TLS, Drip, max_overlap
from .receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 2.0  # seconds; the receiver sends a byte every DRIP seconds, each read may wait 5
DRIP = 0.5


@pytest.fixture
def hooks(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 5  # longer than a drip interval: no read ever times out
    settings.WEBHOOK_ATTEMPT_DEADLINE_SECONDS = DEADLINE
    settings.WEBHOOK_ATTEMPT_LEASE_SECONDS = 120
    return settings


@pytest.fixture
def drip():
    servers = []

    def make(**kw):
        servers.append(Drip(every=DRIP, **kw))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def timed_post(url: str):
    started = time.monotonic()
    outcome = post(url=url, secret="whsec_" + "A" * 44, msg_id="msg_1", event="webhook.test", timestamp=1, body=b"{}")
    return outcome, time.monotonic() - started


@pytest.mark.parametrize("kind", ["status line", "body", "tls handshake"])
def test_a_dripping_receiver_is_cut_at_the_hard_deadline(hooks, drip, kind):
    server = {"status line": lambda: drip(),
              "body": lambda: drip(prefix=b"HTTP/1.0 200 OK\r\n\r\n", answer=SLOW_BODY),
              "tls handshake": lambda: drip(answer=SLOW_TLS, read_request=False)}[kind]()
    url = server.url.replace("http://", "https://") if kind == "tls handshake" else server.url
    outcome, took = timed_post(url)
    assert outcome.ok is False and outcome.error == "deadline: no complete answer within 2 s", outcome
    assert DEADLINE <= took < DEADLINE + scaled(1.0), took
    [conn] = server.snapshot()
    wait_for(lambda: conn.closed, scaled(2), "the receiver to see the connection shut")
    # The receiver was still trickling (a byte every 0.5 s, each read well inside its 5 s) when it was cut.
    assert conn.closed_by_client and 2 <= conn.sent < len(server.answer), conn


def test_a_name_that_resolves_slowly_is_given_up(hooks, monkeypatch):
    hooks.WEBHOOK_TIMEOUT_SECONDS = 1
    released = threading.Event()

    def slow_resolver(*args, **kwargs):
        released.wait(30)  # a customer's name server that does not answer
        raise socket.gaierror("no answer")

    monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)
    try:
        outcome, took = timed_post("http://hooks.customer.example/x")
    finally:
        released.set()
    assert outcome.error == "TimeoutError: hooks.customer.example did not resolve within 1 s", outcome
    assert 1 <= took < 1 + scaled(1.0)


def emit(customer, term, now):
    [delivery] = event_emit(event="webhook.test", term=term, customer=customer, data={}, now=now)
    return delivery


def attempt_in_thread(delivery, at):
    result = {}

    def run():
        result["state"] = webhook_deliver(delivery.pk, at.isoformat())

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_one_attempt_in_flight_per_delivery_until_its_lease_expires(hooks, drip, catalog, customer, monkeypatch):
    server = drip()
    webhook_endpoint_save(customer=customer, url=server.url)
    queued = []
    monkeypatch.setattr(notifications, "_queue", lambda pk, at, countdown=0: queued.append(pk))
    t0 = timezone.now()
    delivery = emit(customer, "lease", t0)
    queued.clear()
    first, result = attempt_in_thread(delivery, t0)
    wait_for(lambda: server.open_now(), scaled(5), "the first attempt to connect")
    claimed = WebhookDelivery.objects.get(pk=delivery.pk).claimed_at

    # While it is connected: the old "stuck" rule (4 timeouts + 60 s) freed it at +80 s. The lease
    # (120 s) does not; a duplicate message finds it taken.
    later = claimed + timedelta(seconds=100)
    assert sweep_webhooks(later) == [] and queued == []
    assert webhook_deliver(delivery.pk, later.isoformat()) is None
    assert len(server.snapshot()) == 1
    assert WebhookDelivery.objects.get(pk=delivery.pk).state == "sending"

    first.join(scaled(DEADLINE + 5))
    assert result["state"] == "pending"  # cut at the deadline, retried after WEBHOOK_RETRY_SECONDS[0]
    row = WebhookDelivery.objects.get(pk=delivery.pk)
    assert (row.attempts, row.last_error, row.claimed_at) == (1, "deadline: no complete answer within 2 s", None)
    [conn] = server.snapshot()
    wait_for(lambda: conn.closed, scaled(2), "the receiver to see the first connection shut")
    # The retry is attempted (eager Celery: the sweep's queueing is the attempt), on a second
    # connection that opens only after the first one closed.
    monkeypatch.undo()
    sweep_webhooks(row.next_attempt_at)
    second = server.snapshot()[1]
    assert conn.closed <= second.opened and WebhookDelivery.objects.get(pk=delivery.pk).attempts == 2


def test_an_attempt_whose_lease_expired_records_nothing_over_the_next_claim(hooks, drip, catalog, customer,
                                                                            monkeypatch):
    """A worker that died mid-attempt: the sweep frees its delivery once the lease expired, never
    before. Should the 'dead' attempt come back and finish, its result must not overwrite the
    claim of the attempt that replaced it (else that one's delivery looked free while connected)."""
    server = drip()
    webhook_endpoint_save(customer=customer, url=server.url)
    monkeypatch.setattr(notifications, "_queue", lambda pk, at, countdown=0: None)
    t0 = timezone.now()
    delivery = emit(customer, "lease", t0)
    first, result = attempt_in_thread(delivery, t0)
    wait_for(lambda: server.open_now(), scaled(5), "the attempt to connect")
    claimed = WebhookDelivery.objects.get(pk=delivery.pk).claimed_at
    sweep_webhooks(claimed + timedelta(seconds=119))
    assert WebhookDelivery.objects.get(pk=delivery.pk).state == "sending"
    sweep_webhooks(claimed + timedelta(seconds=120))
    assert WebhookDelivery.objects.get(pk=delivery.pk).state == "pending"
    replaced_at = claimed + timedelta(seconds=121)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(state="sending", claimed_at=replaced_at)  # another worker
    first.join(scaled(DEADLINE + 5))
    row = WebhookDelivery.objects.get(pk=delivery.pk)
    assert result["state"] is None  # its result was dropped
    assert (row.state, row.claimed_at, row.attempts, row.last_error) == ("sending", replaced_at, 0, "")


def test_an_account_has_at_most_its_share_of_attempts_in_flight(hooks, drip, catalog, customer, other_customer,
                                                                monkeypatch):
    hooks.WEBHOOK_CONCURRENCY_PER_ACCOUNT = 1
    hooks.CELERY_TASK_ALWAYS_EAGER = False  # queueing is recorded below, not run
    server, fast = drip(), Receiver()
    try:
        webhook_endpoint_save(customer=customer, url=server.url)
        webhook_endpoint_save(customer=other_customer, url=fast.url)
        queued = []
        monkeypatch.setattr(notifications, "_queue", lambda pk, at, countdown=0: queued.append(pk))
        t0 = timezone.now()
        slow1, slow2 = emit(customer, "one", t0), emit(customer, "two", t0)
        other = emit(other_customer, "three", t0)
        # A delivery whose worker died long ago holds no slot: its lease expired.
        dead = emit(customer, "dead", t0)
        WebhookDelivery.objects.filter(pk=dead.pk).update(state="sending", claimed_at=t0 - timedelta(seconds=121))
        queued.clear()
        first, result = attempt_in_thread(slow1, t0)
        wait_for(lambda: server.open_now(), scaled(5), "the first attempt to connect")

        assert webhook_deliver(slow2.pk, t0.isoformat()) == BUSY  # the account's one slot is taken
        assert WebhookDelivery.objects.get(pk=slow2.pk).state == "pending" and len(server.snapshot()) == 1
        assert webhook_deliver(other.pk, t0.isoformat()) == "delivered"  # another account is not held up
        assert len(fast.requests) == 1 and server.open_now()

        first.join(scaled(DEADLINE + 5))
        assert result["state"] == "pending"
        # Its retry is queued for later, and it handed its slot to the account's waiting delivery.
        assert queued == [slow1.pk, slow2.pk]
        assert webhook_deliver(slow2.pk, t0.isoformat()) == "pending"  # and it runs (cut at the deadline too)
        connections = server.snapshot()
        wait_for(lambda: all(c.closed for c in connections), scaled(2), "the receiver to see both connections shut")
        assert len(connections) == 2 and max_overlap(connections, key=lambda c: c.path) == 1
    finally:
        fast.close()


def test_check_refuses_a_lease_not_longer_than_the_deadline(settings):
    settings.WEBHOOK_ATTEMPT_DEADLINE_SECONDS, settings.WEBHOOK_ATTEMPT_LEASE_SECONDS = 15, 15
    assert [e.id for e in checks.run_checks() if e.id.startswith("rental.E03")] == ["rental.E031"]
    settings.WEBHOOK_ATTEMPT_LEASE_SECONDS = 16
    assert [e.id for e in checks.run_checks() if e.id.startswith("rental.E03")] == []
