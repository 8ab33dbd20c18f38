"""The idle notice (fleet/idle.py): every card of an active lease under the threshold for
WORKBENCH_IDLE_HOURS tells its customer once per idle stretch — in-app, by e-mail and as the
webhook event lease.idle — and never an account that turned it off, nor a lease whose node
stopped sending readings."""
from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from fleet.idle import sweep_idle_notices
from fleet.telemetry import Parsed, store
from inventory.models import SlotAllocation
from rental.models import CustomerSettings, LeaseState, Notification
from rental.notifications.models import WebhookDelivery, WebhookEndpoint
from tests.fleet.conftest import enrol, node_agent_driver, node_of, paid_lease, ready  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def idle_lease(paid_lease, enrol, customer):  # noqa: F811
    lease = paid_lease(offer="2x-a100-sxm")
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    # the cards were held two days already, so readings from then are this lease's
    SlotAllocation.objects.filter(lease_id=lease.pk).update(allocated_at=timezone.now() - timedelta(days=2))
    WebhookEndpoint.objects.create(owner=customer, url="https://hooks.example/x", created_at=timezone.now())
    return lease, node.node


def feed(lease, node, start, minutes: int, util: int, skip_card: int | None = None):
    cards = SlotAllocation.objects.filter(lease_id=lease.pk).values_list("slot__index", flat=True)
    first = int(start.timestamp() // 60)
    store(node.pk, Parsed(samples=[(first + m, card, {"util": util, "mem_mb": 10, "temp_c": 35, "power_w": 60,
                                                      "sm_mhz": 300})
                                   for m in range(minutes) for card in cards if card != skip_card]))


def idle_notices():
    return list(Notification.objects.filter(kind="gpus_idle").order_by("pk"))


def test_one_notice_per_idle_stretch(idle_lease, settings, django_capture_on_commit_callbacks):
    settings.WORKBENCH_IDLE_HOURS = 24
    lease, node = idle_lease
    now = timezone.now().replace(second=0, microsecond=0)
    feed(lease, node, now - timedelta(hours=30), 390, util=90)                     # busy 6.5 hours…
    feed(lease, node, now - timedelta(hours=23, minutes=30), 23 * 60 + 30, util=2)  # …then idle 23.5 h
    assert sweep_idle_notices(now) == [] and idle_notices() == []
    feed(lease, node, now, 90, util=1)
    with django_capture_on_commit_callbacks(execute=True):                        # the e-mail goes on commit
        sent = sweep_idle_notices(now + timedelta(minutes=45))                     # idle 24.25 h
    assert len(sent) == 1
    [note] = idle_notices()
    assert note.deadline == now - timedelta(hours=23, minutes=30)                 # the stretch's start
    assert "idle for 24 hours" in note.subject and "under 5 %" in note.body
    assert [m.to for m in mail.outbox if "idle" in m.subject] == [["alice@example.org"]]
    assert WebhookDelivery.objects.filter(event="lease.idle").count() == 1
    # the same stretch, checked again an hour later: nothing new
    assert sweep_idle_notices(now + timedelta(minutes=89)) == [] and len(idle_notices()) == 1
    # a busy minute ends it; 24 idle hours after it, one more notice
    feed(lease, node, now + timedelta(minutes=90), 1, util=60)
    feed(lease, node, now + timedelta(minutes=91), 24 * 60 + 5, util=0)
    assert len(sweep_idle_notices(now + timedelta(minutes=91 + 24 * 60 + 2))) == 1
    assert [n.deadline for n in idle_notices()][-1] == now + timedelta(minutes=91)
    assert WebhookDelivery.objects.filter(event="lease.idle").count() == 2


def test_opted_out_account_gets_none(idle_lease, customer):
    lease, node = idle_lease
    CustomerSettings.objects.update_or_create(user=customer, defaults={"idle_notices": False})
    now = timezone.now().replace(second=0, microsecond=0)
    feed(lease, node, now - timedelta(hours=25), 25 * 60, util=0)
    assert sweep_idle_notices(now) == [] and idle_notices() == []


def test_a_card_without_readings_is_not_idle(idle_lease):
    lease, node = idle_lease
    cards = list(SlotAllocation.objects.filter(lease_id=lease.pk).values_list("slot__index", flat=True))
    now = timezone.now().replace(second=0, microsecond=0)
    feed(lease, node, now - timedelta(hours=25), 25 * 60, util=0, skip_card=cards[0])
    assert sweep_idle_notices(now) == []
    # nor one whose node stopped sending two hours ago
    feed(lease, node, now - timedelta(hours=25), 25 * 60, util=0)
    assert sweep_idle_notices(now + timedelta(hours=2)) == []
    assert len(sweep_idle_notices(now)) == 1


def test_the_opt_out_is_on_the_settings_page(client, customer):
    client.force_login(customer)
    page = client.get(reverse("account_settings")).content.decode()
    field = next(tag for tag in page.split("<input")[1:] if 'name="idle_notices"' in tag).split(">")[0]
    assert "checked" in field          # on by default
    response = client.post(reverse("account_settings"), {"email": "alice@example.org", "auto_renew": "on"})
    assert response.status_code in (302, 303)
    assert CustomerSettings.objects.get(user=customer).idle_notices is False
