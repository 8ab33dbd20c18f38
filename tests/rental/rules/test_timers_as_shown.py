"""The lifecycle timers as customers read them (they were shown but never read by
a test): the home, FAQ and storage pages and the projected lease timeline state the values
of rental/rules.py's settings — set here to values unlike the defaults, so a page or a
projection that retypes 72 h / 24 h / 7 days fails."""
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from rental.models import Lease, LeaseState
from rental.timeline import lease_milestones, term_milestones
from tests.factories import order


@pytest.fixture
def odd_timers(settings):
    settings.LEASE_HOLD_HOURS = 50
    settings.LEASE_RENEWAL_LEAD_HOURS = 30
    settings.LEASE_WIPE_WITHIN_DAYS = 5
    settings.LEASE_REFUND_WINDOW_MINUTES = 25
    settings.LANGUAGE_CODE = "en"


def text_of(client, path: str) -> str:
    response = client.get(path, HTTP_ACCEPT_LANGUAGE="en")
    assert response.status_code == 200
    return re.sub(r"\s+", " ", response.content.decode())


@pytest.mark.django_db
def test_pages_state_the_configured_timers(client, catalog, odd_timers):
    assert "unpaid instances are stopped and held 50 h, then the disk key is destroyed" in text_of(client, "/")
    faq = text_of(client, "/faq/")
    assert "We send a renewal invoice 30 hours before the term ends" in faq
    assert "its slot held for 50 hours from the stop" in faq and "(within 5 days of the stop at the latest)" in faq
    storage = text_of(client, "/storage/")
    assert "the key is destroyed after the 50-hour hold, and the disk is wiped within 5 days" in storage


def test_the_projected_timeline_uses_the_configured_timers(odd_timers):
    start = timezone.now().replace(microsecond=0)
    end = start + timedelta(days=7)
    at = {m.key: (m.at, str(m.label)) for m in term_milestones(start=start, end=end)}
    assert at["renewal"][0] == end - timedelta(hours=30)
    assert at["hold"] == (end + timedelta(hours=50), "Hold ends (50 h after the stop): slots released")
    assert at["key"][0] == end + timedelta(hours=50)
    assert at["wipe"] == (end + timedelta(days=5), "Local NVMe wiped (at the latest 5 days after the stop)")


def test_the_order_page_states_the_configured_refund_window(client, catalog, customer, odd_timers):
    """The one-click refund's promise on the order page, before anyone has paid."""
    from django.urls import reverse

    client.force_login(customer)
    assert "Refund in one click within 25 minutes of ordering" in text_of(client, reverse("order", args=["rtx-3090"]))


@pytest.mark.django_db
def test_an_active_leases_timeline_projects_the_hold_from_its_end(catalog, customer, odd_timers):
    now = timezone.now().replace(microsecond=0)
    lease, _ = order(customer, now, pay=False)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.ACTIVE, started_at=now, ends_at=now + timedelta(days=7))
    lease.refresh_from_db()
    at = {m.key: m.at for m in lease_milestones(lease, now)}
    assert at["hold"] == at["key"] == lease.ends_at + timedelta(hours=50)
    assert at["wipe"] == lease.ends_at + timedelta(days=5)
