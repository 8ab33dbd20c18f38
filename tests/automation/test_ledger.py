"""The notifications ledger — every reminder, notice and webhook is one row per
(recipient, event, term) under a unique constraint, so lifecycle passes run twice, or at
the same moment on PostgreSQL (no lifecycle lock: run_lifecycle itself, in threads), send
each message once: one in-app notice, one e-mail, one webhook delivery per endpoint."""
from collections import Counter
from datetime import timedelta

import pytest
from django.core import mail
from django.db import IntegrityError, transaction

from ops.lifecycle import run_lifecycle
from rental.models import Notification
from rental.notifications.models import Dispatch, WebhookDelivery
from rental.notifications.services import dispatch_claim, webhook_endpoint_save
from tests.billing.races import in_threads

from .helpers import active_lease, drain_balance
from .receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)
N = 4


def leases_with_webhooks(t0, receiver, n=N):
    from rental.services import account_create

    leases = []
    for i in range(n):
        user = account_create(username=f"ledger{i}", password="correct horse battery 9",
                              email=f"ledger{i}@example.org")
        leases.append(active_lease(user, t0))
        drain_balance(user, t0)
        webhook_endpoint_save(customer=user, url=receiver.url)
    return leases


def moments(lease):
    end = lease.ends_at
    return [end - timedelta(days=3), end - timedelta(hours=23), end + timedelta(minutes=1),
            end + timedelta(hours=73)]


def assert_each_message_once(leases, receiver):
    kinds = Counter(Notification.objects.values_list("kind", flat=True))
    assert kinds == Counter({"reminder_3d": N, "reminder_1d": N, "renewal_invoice": N, "suspended": N,
                             "released": N})
    assert len(mail.outbox) == 5 * N
    assert set(Counter(m.to[0] for m in mail.outbox).values()) == {5}  # five e-mails to each customer
    per_endpoint = Counter(WebhookDelivery.objects.values_list("endpoint_id", "event", "dispatch__term"))
    assert set(per_endpoint.values()) == {1}
    assert Counter(WebhookDelivery.objects.values_list("event", flat=True)) == Counter(
        {"lease.reminder": 2 * N, "invoice.renewal": N, "lease.suspended": N, "lease.released": N,
         "key.destroyed": N})
    assert Counter(receiver.events()).most_common(1)[0][1] == 1  # the receiver saw each (event, term) once
    assert len({r["headers"]["webhook-id"] for r in receiver.requests}) == len(receiver.requests) == 6 * N
    assert Dispatch.objects.filter(recipient__startswith="user:").count() == 5 * N


def test_the_unique_constraint_refuses_a_second_claim(db, t0):
    assert dispatch_claim(recipient="email:1", event="reminder_1d", term="lease:1@x", now=t0)
    assert dispatch_claim(recipient="email:1", event="reminder_1d", term="lease:1@x", now=t0) is None
    with pytest.raises(IntegrityError), transaction.atomic():
        Dispatch.objects.create(recipient="email:1", event="reminder_1d", term="lease:1@x", created_at=t0)


def test_each_pass_run_twice_sends_each_message_once(catalog, t0, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    receiver = Receiver()
    try:
        leases = leases_with_webhooks(t0, receiver)
        mail.outbox.clear()
        for at in moments(leases[0]):
            run_lifecycle(at)
            run_lifecycle(at)
        assert_each_message_once(leases, receiver)
    finally:
        receiver.close()


@pytest.mark.postgres
def test_concurrent_passes_on_postgres_send_each_message_once(catalog, t0, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    receiver = Receiver()
    try:
        leases = leases_with_webhooks(t0, receiver)
        mail.outbox.clear()
        for at in moments(leases[0]):
            results = in_threads(*[lambda at=at: run_lifecycle(at)] * 3)
            assert not [r for r in results if isinstance(r, BaseException)], results
        assert_each_message_once(leases, receiver)
    finally:
        receiver.close()
