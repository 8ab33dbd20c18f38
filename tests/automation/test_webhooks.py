"""Signed webhooks to a local receiver over real HTTP — events once per endpoint,
the retry back-off, redelivery, the delivery log, and the SSRF guard (loopback is allowed
only through WEBHOOK_ALLOW_PRIVATE_ADDRESSES, which `check --deploy` refuses)."""
import base64
import hashlib
import hmac
import ipaddress
import socket
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ops.lifecycle import run_lifecycle
from rental.notifications.models import WebhookDelivery, WebhookEndpoint
from rental.notifications.sending import address_allowed
from rental.notifications.services import (
    delivery_redeliver,
    event_emit,
    sweep_webhooks,
    webhook_endpoint_save,
)

from .helpers import active_lease, drain_balance
from .receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def loopback_allowed(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_TIMEOUT_SECONDS = 2


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def verify(request, secret: str) -> bool:
    h = request["headers"]
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + request["body"], hashlib.sha256)
    return hmac.compare_digest(h["webhook-signature"], "v1," + base64.b64encode(mac.digest()).decode())


def test_lease_events_reach_the_customer_and_operator_endpoints_signed_and_once(
        catalog, customer, other_customer, operator, t0, loopback_allowed, receiver):
    ops = Receiver()
    try:
        endpoint, secret = webhook_endpoint_save(customer=customer, url=receiver.url)
        WebhookEndpoint.objects.create(owner=operator, scope="operator", url=ops.url, created_at=t0)
        lease = active_lease(customer, t0)
        active_lease(other_customer, t0)  # bob's events never reach alice's endpoint
        run_lifecycle(t0 + timedelta(minutes=4))  # a second pass sends nothing again
        got = Counter(event for event, _term in receiver.events())
        assert got == Counter({"order.placed": 1, "invoice.paid": 1, "instance.ready": 1})
        assert all(r["json"]["data"]["lease"]["id"] == lease.pk for r in receiver.requests)
        for request in receiver.requests:
            assert verify(request, secret)
            assert request["headers"]["webhook-id"] == request["json"]["id"]
            assert request["headers"]["webhook-event"] == request["json"]["type"]
        ready = next(r["json"] for r in receiver.requests if r["json"]["type"] == "instance.ready")
        assert ready["data"]["lease"]["ssh"].startswith("ssh -p ")
        assert Counter(event for event, _t in ops.events()) == Counter(
            {"order.placed": 2, "invoice.paid": 2, "instance.ready": 2})  # the operator sees both customers
        tampered = {**receiver.requests[0], "body": receiver.requests[0]["body"] + b" "}
        assert not verify(tampered, secret)
    finally:
        ops.close()


def test_notices_become_webhook_events_once_however_often_the_lifecycle_runs(
        catalog, customer, t0, loopback_allowed, receiver):
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)  # the renewal stays unpaid: suspended, then released
    webhook_endpoint_save(customer=customer, url=receiver.url)
    end = lease.ends_at
    for at in (end - timedelta(days=3), end - timedelta(days=3), end - timedelta(hours=23),
               end - timedelta(hours=23), end + timedelta(minutes=1), end + timedelta(minutes=2),
               end + timedelta(hours=73), end + timedelta(hours=74)):
        run_lifecycle(at)
    got = Counter(event for event, _term in receiver.events())
    assert got == Counter({"lease.reminder": 2, "invoice.renewal": 1, "lease.suspended": 1, "lease.released": 1,
                           "key.destroyed": 1})
    assert len(set(receiver.events())) == len(receiver.requests)  # each (event, term) once


def test_failed_deliveries_follow_the_back_off_then_redeliver(catalog, customer, t0, loopback_allowed, settings):
    receiver = Receiver(statuses=[500, 503])
    try:
        webhook_endpoint_save(customer=customer, url=receiver.url)
        [delivery] = event_emit(event="webhook.test", term="t1", customer=customer, data={}, now=t0)
        delivery.refresh_from_db()
        assert (delivery.state, delivery.attempts, delivery.last_status) == ("pending", 1, 500)
        first_retry = delivery.next_attempt_at  # 10 s after the first attempt (at the real clock, ≥ t0)
        assert timedelta(seconds=10) <= first_retry - t0 < timedelta(seconds=15)
        sweep_webhooks(first_retry - timedelta(seconds=1))
        assert len(receiver.requests) == 1  # not due yet
        sweep_webhooks(first_retry)
        delivery.refresh_from_db()
        assert delivery.attempts == 2 and delivery.next_attempt_at == first_retry + timedelta(seconds=60)
        sweep_webhooks(first_retry + timedelta(seconds=60))
        delivery.refresh_from_db()
        assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 3, 200)
        assert {r["headers"]["webhook-id"] for r in receiver.requests} == {str(delivery.delivery_id)}
        sweep_webhooks(t0 + timedelta(hours=2))
        assert len(receiver.requests) == 3  # delivered: never again by itself
        again = delivery_redeliver(delivery=delivery, actor=customer, now=t0 + timedelta(hours=2))
        again.refresh_from_db()
        assert again.state == "delivered" and again.delivery_id != delivery.delivery_id
        assert len(receiver.requests) == 4 and receiver.requests[-1]["json"]["term"] == "t1"
    finally:
        receiver.close()


def test_retries_give_up_after_the_schedule(catalog, customer, t0, loopback_allowed):
    receiver = Receiver(statuses=[500] * 20)
    try:
        webhook_endpoint_save(customer=customer, url=receiver.url)
        [delivery] = event_emit(event="webhook.test", term="t2", customer=customer, data={}, now=t0)
        at, waits = t0, []
        for _ in range(12):
            delivery.refresh_from_db()
            if delivery.state != "pending":
                break
            waits.append(int((delivery.next_attempt_at - at).total_seconds()))
            at = delivery.next_attempt_at
            sweep_webhooks(at)
        assert 10 <= waits[0] < 15 and waits[1:] == [60, 600, 600, 600, 600, 600, 600]
        assert delivery.state == "failed" and delivery.attempts == 9 == len(receiver.requests)
    finally:
        receiver.close()


def test_a_slow_receiver_times_out_and_is_retried(catalog, customer, t0, loopback_allowed, settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 0.3
    receiver = Receiver(delay=1.5)
    try:
        webhook_endpoint_save(customer=customer, url=receiver.url)
        [delivery] = event_emit(event="webhook.test", term="t3", customer=customer, data={}, now=t0)
        delivery.refresh_from_db()
        assert delivery.state == "pending" and "timed out" in delivery.last_error.lower()
    finally:
        receiver.close()


def test_private_loopback_and_link_local_addresses_are_refused_by_default(catalog, customer, t0, receiver,
                                                                          settings):
    assert settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES is False
    for address in ("127.0.0.1", "10.1.2.3", "192.168.0.10", "172.16.5.5", "169.254.169.254", "100.64.0.1",
                    "0.0.0.0", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "224.0.0.1",
                    # IPv6 that a relay or translator turns into a private IPv4 address
                    "2002:7f00:1::", "2002:a01:203::1", "2001:0:4136:e378:8000:63bf:80ff:fffe",
                    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "::127.0.0.1"):
        assert not address_allowed(ipaddress.ip_address(address)), address
    for address in ("93.184.215.14", "::ffff:93.184.215.14", "2002:5db8:d70e::1", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"):
        assert address_allowed(ipaddress.ip_address(address)), address
    webhook_endpoint_save(customer=customer, url=receiver.url)
    [delivery] = event_emit(event="webhook.test", term="t4", customer=customer, data={}, now=t0)
    delivery.refresh_from_db()
    assert "refused" in delivery.last_error and "127.0.0.1" in delivery.last_error
    assert receiver.requests == []


def test_the_resolved_address_is_checked_and_pinned(catalog, customer, t0, receiver, settings, monkeypatch):
    """A name that resolves to a loopback address is refused after resolving it; allowed
    (tests only), the name is resolved once per attempt and the connection goes to that
    address (a literal: no second lookup of the name) with the name as Host."""
    real = socket.getaddrinfo
    calls = []

    def fake(host, port, *args, **kwargs):
        calls.append(host)
        if host == "hooks.example":
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    url = f"http://hooks.example:{receiver.port}/in"
    webhook_endpoint_save(customer=customer, url=url)
    [refused] = event_emit(event="webhook.test", term="t5", customer=customer, data={}, now=t0)
    refused.refresh_from_db()
    assert "refused" in refused.last_error and receiver.requests == []
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    calls.clear()
    [delivery] = event_emit(event="webhook.test", term="t6", customer=customer, data={}, now=t0)
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and calls == ["hooks.example", "127.0.0.1"]
    assert receiver.requests[0]["headers"]["host"] == f"hooks.example:{receiver.port}"


def test_check_deploy_refuses_private_webhook_addresses(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    with pytest.raises(SystemCheckError, match="rental.E030"):
        call_command("check", "--deploy", "--fail-level", "ERROR", tags=["security"])


def test_settings_page_shows_the_secret_once_the_log_and_redelivers(client, catalog, customer, t0,
                                                                    loopback_allowed, receiver):
    client.force_login(customer)
    page = client.post("/account/webhooks/", {"url": receiver.url}).content.decode()
    endpoint = WebhookEndpoint.objects.get(owner=customer)
    assert endpoint.secret in page
    assert endpoint.secret not in client.get("/account/settings/").content.decode()
    assert client.post("/account/webhooks/test/").status_code == 302
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    page = client.get("/account/settings/").content.decode()
    assert str(delivery.delivery_id) in page and f"/account/webhooks/deliveries/{delivery.pk}/redeliver/" in page
    assert client.post(f"/account/webhooks/deliveries/{delivery.pk}/redeliver/").status_code == 302
    assert WebhookDelivery.objects.filter(endpoint=endpoint).count() == 2 and len(receiver.requests) == 2
    response = client.post("/account/webhooks/", {"url": "ftp://example.org/x"})
    assert response.status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.url == receiver.url  # refused, unchanged


def test_test_events_and_redeliveries_are_limited_per_customer_and_never_reach_the_operators(
        client, catalog, customer, operator, t0, loopback_allowed, receiver, settings):
    settings.WEBHOOK_MANUAL_SENDS_PER_USER, settings.WEBHOOK_MANUAL_SEND_WINDOW_MINUTES = 3, 10
    ops = Receiver()
    try:
        WebhookEndpoint.objects.create(owner=operator, scope="operator", url=ops.url, created_at=t0)
        endpoint, _secret = webhook_endpoint_save(customer=customer, url=receiver.url)
        client.force_login(customer)
        answers = [client.post("/account/webhooks/test/").status_code for _ in range(2)]
        delivery = WebhookDelivery.objects.filter(endpoint=endpoint).first()
        answers.append(client.post(f"/account/webhooks/deliveries/{delivery.pk}/redeliver/").status_code)
        refused = client.post("/account/webhooks/test/")
        assert answers == [302, 302, 302] and refused.status_code == 429
        assert refused["Retry-After"] == "600"
        assert client.post(f"/account/webhooks/deliveries/{delivery.pk}/redeliver/").status_code == 429
        assert WebhookDelivery.objects.filter(endpoint=endpoint).count() == 3 and len(receiver.requests) == 3
        assert ops.requests == [] and not WebhookDelivery.objects.filter(endpoint__scope="operator").exists()
    finally:
        ops.close()


def test_admin_redeliver_action(client, catalog, customer, operator, t0, loopback_allowed, receiver):
    webhook_endpoint_save(customer=customer, url=receiver.url)
    [delivery] = event_emit(event="webhook.test", term="t7", customer=customer, data={}, now=t0)
    client.force_login(operator)
    response = client.post("/admin/rental/webhookdelivery/", {"action": "redeliver", "_selected_action": [delivery.pk]})
    assert response.status_code == 302
    assert WebhookDelivery.objects.filter(redelivery_of=delivery, state="delivered").count() == 1
    assert len(receiver.requests) == 2


def test_incident_and_migration_notices_are_webhook_events(catalog, customer, t0, loopback_allowed, receiver):
    """The incident notice (rental.failover.incident_notify_customers sends it with notify)
    and the new connection line after a migration reach the endpoint as their events."""
    from rental.agent import Instance
    from rental.services import lease_connection_update, notify

    lease = active_lease(customer, t0)
    webhook_endpoint_save(customer=customer, url=receiver.url)
    for _ in range(2):
        notify(lease=lease, kind="incident", deadline=t0, subject="down", body="hardware out of service", now=t0)
    assert lease_connection_update(lease_id=lease.pk, instance=Instance(host="198.51.100.9", ssh_port=2222), now=t0,
                                   reason="migrated")
    assert [event for event, _term in receiver.events()] == ["incident", "lease.migrated"]
    moved = receiver.requests[1]["json"]["data"]
    assert moved["lease"]["ssh"] == "ssh -p 2222 root@198.51.100.9" and "198.51.100.9" in moved["notice"]["body"]
