"""The lease page tells the customer what is happening: an incident on its node
shows as a banner and the status says the instance is down; the header counts unread
notices; after the migration a note, a follow-up notice with the connection line, and the
banner gone. The page region polls while something is in progress and not otherwise (and
reloads itself without JavaScript meanwhile); the renewal invoice has a call to action; the
refund promise carries its monthly limit and no refund button is offered when none is left."""
import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice
from rental.failover import incident_migrate
from rental.models import LeaseEvent, Notification
from tests.experience.scenes import node_down, node_of, renewal_due, running_lease
from tests.factories import order_url, place

POLL = 'hx-trigger="every 3s"'


@pytest.fixture(autouse=True)
def _fast_agent(settings):
    settings.HOST_AGENT_FAKE_DELAY = 0


def _page(client, lease, **extra):
    response = client.get(reverse("lease_detail", args=[lease.pk]), **extra)
    assert response.status_code == 200
    return response.content.decode()


def test_incident_banner_header_count_migration_note_and_follow_up_notice(client, catalog, customer):
    lease = running_lease(customer)
    client.force_login(customer)
    calm = _page(client, lease)
    assert "Your instance is running." in calm and POLL not in calm and 'id="incident-banner"' not in calm
    assert 'class="badge warn notice-count"' not in calm

    incident = node_down(lease)
    down = _page(client, lease)
    assert 'id="incident-banner"' in down and "Hardware problem" in down
    assert "Your instance is down" in down and "Your instance is running." not in down
    assert POLL in down  # waiting for the repair or the move: the page updates itself
    assert 'notice-count" aria-label="1 unread">1</span>' in down

    failed = node_of(lease)
    report = incident_migrate(incident=incident)
    assert [m["lease_id"] for m in report.moved] == [lease.pk] and node_of(lease) != failed
    moved = _page(client, lease)
    assert 'id="incident-banner"' not in moved and 'id="migration-note"' in moved
    assert "Moved to working hardware" in moved and "Your instance is running." in moved
    assert POLL not in moved  # nothing in progress any more: polling stops
    note = Notification.objects.get(lease=lease, kind="migrated")
    lease.refresh_from_db()
    assert "moved to working hardware" in note.subject and f"Connect with: {lease.ssh_command}" in note.body
    assert 'aria-label="2 unread">2</span>' in moved
    settings_page = client.get(reverse("account_settings")).content.decode()
    assert settings_page.index('id="notifications"') < settings_page.index("Reminders and renewals")


def test_the_follow_up_notice_in_the_customers_language(client, catalog, customer):
    from rental.models import CustomerSettings

    lease = running_lease(customer)
    CustomerSettings.objects.update_or_create(user=customer, defaults={"language": "zh-hans"})
    incident_migrate(incident=node_down(lease))
    note = Notification.objects.get(lease=lease, kind="migrated")
    assert "已迁移到" in note.subject and "连接" in note.body


def test_the_whole_page_region_polls_while_pending_and_htmx_gets_the_region(client, catalog, customer):
    lease, invoice = place(customer)
    client.force_login(customer)
    page = _page(client, lease)
    assert f'<div id="lease-live" hx-get="{reverse("lease_detail", args=[lease.pk])}" {POLL}' in page
    assert '<noscript><meta http-equiv="refresh" content="10"></noscript>' in page  # without JavaScript
    fragment = _page(client, lease, HTTP_HX_REQUEST="true")
    assert fragment.startswith("{% load") is False and fragment.lstrip().startswith('<div id="lease-live"')
    for part in ('id="lease-status"', 'class="timeline"', "Order placed", f"#{invoice.pk}"):
        assert part in fragment  # status, timeline, events and invoices are all refreshed
    assert "<html" not in fragment


def test_a_restart_keeps_the_page_polling_until_it_settles(client, catalog, customer):
    from datetime import timedelta

    from rental.lease_page import INSTANCE_ACTION_SETTLES
    from rental.services import lease_record

    lease = running_lease(customer)
    client.force_login(customer)
    lease_record(lease_id=lease.pk, kind="instance_restart", now=timezone.now(), actor=customer)
    assert POLL in _page(client, lease)
    LeaseEvent.objects.filter(lease=lease, kind="instance_restart").update(
        at=timezone.now() - INSTANCE_ACTION_SETTLES - timedelta(seconds=1))
    assert POLL not in _page(client, lease)


def test_the_renewal_invoice_has_a_call_to_action(client, catalog, customer):
    lease = running_lease(customer)
    invoice = renewal_due(lease)
    client.force_login(customer)
    page = _page(client, lease)
    assert 'id="renewal-cta"' in page and f"Renew: pay invoice #{invoice.pk}" in page
    assert reverse("billing:invoice", args=[invoice.pk]) in page.split('id="renewal-cta"')[1]
    detail = client.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
    assert "Renewal due" in detail and f"keeps lease #{lease.pk} running for another 1 week" in detail
    assert 'href="#pay"' in detail and 'id="pay"' in detail


def test_the_refund_limit_is_shown_where_the_refund_is_promised_and_no_button_when_none_is_left(
        client, catalog, customer, settings):
    from billing.refunds import lease_refund

    client.force_login(customer)
    order = client.get(order_url()).content.decode()
    assert "1 refund of money a month (1 left this month)" in order
    first = running_lease(customer)
    lease_refund(lease=first, actor=customer)  # this month's one refund of money
    order = client.get(order_url()).content.decode()
    assert "You have used your 1 no-questions refund of money this month" in order
    second = running_lease(customer)
    page = _page(client, second)
    assert "Cancel and refund…" not in page and 'id="refund-used"' in page
    unpaid, invoice = place(customer)  # cancelling an unpaid order does not count: still offered
    assert invoice.state == Invoice.State.OPEN and "Cancel and refund…" in _page(client, unpaid)
