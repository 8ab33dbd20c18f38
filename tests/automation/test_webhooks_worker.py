"""Webhook deliveries on a real Celery worker (subprocess, Redis, the test
database on PostgreSQL): the delivery task queued three times for one delivery (a
duplicated message, a retry racing the sweep) posts it once."""
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from rental.notifications import services as notifications
from rental.notifications.models import WebhookDelivery
from rental.notifications.services import event_emit, webhook_endpoint_save
from tests.billing.celery_workers import Worker, wait_for

from .receiver import Receiver

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def test_a_worker_delivers_each_delivery_once_however_often_it_is_queued(
        catalog, customer, queue, tmp_path, monkeypatch):  # noqa: F811 (queue: the fixture)
    name, sender = queue
    receiver = Receiver()
    sent = []

    def to_test_queue(delivery_id, at, countdown=0):
        for _ in range(3):
            sent.append(sender.send_task("rental.webhook_deliver", args=[delivery_id, at.isoformat()], queue=name))

    monkeypatch.setattr(notifications, "_queue", to_test_queue)
    workers = [Worker(f"hook{i}", name, tmp_path / f"hook{i}.log", WEBHOOK_ALLOW_PRIVATE_ADDRESSES="1")
               for i in (1, 2)]
    try:
        for worker in workers:
            worker.wait_ready(timeout=120)  # a loaded machine starts workers slowly
        webhook_endpoint_save(customer=customer, url=receiver.url)
        now = timezone.now()
        [delivery] = event_emit(event="webhook.test", term="worker", customer=customer, data={"n": 1}, now=now)
        wait_for(lambda: sum(w.succeeded() for w in workers) == 3, 60, "the three task messages")
        time.sleep(0.5)
    finally:
        for worker in workers:
            worker.stop()
        receiver.close()
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.attempts == 1
    assert len(receiver.requests) == 1 and receiver.requests[0]["headers"]["webhook-id"] == str(delivery.delivery_id)
    assert WebhookDelivery.objects.count() == 1 and len(sent) == 3
    assert delivery.delivered_at - now < timedelta(seconds=60)
