"""What the customer sees is true: the lease page's state comes from one place (after Stop
the header agrees with the instance block), incidents that affected a lease stay on its
page, the SLA form offers only months with an affected lease, every storage price is on the
storage pages, and notice e-mails carry the store's name and a link."""
from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from inventory.incidents import incident_close, incident_open
from inventory.models import Site, SlotAllocation
from rental.notifications.notices import notify
from tests.automation.helpers import active_lease

pytestmark = pytest.mark.django_db


@pytest.fixture
def lease(catalog, customer, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    lease = active_lease(customer, timezone.now() - timedelta(days=1))
    # Its GPUs held since long enough for last month's incident to have touched them.
    SlotAllocation.objects.filter(lease_id=lease.pk).update(allocated_at=timezone.now() - timedelta(days=70))
    return lease


def test_after_stop_the_header_and_the_instance_block_agree(client, customer, lease):
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert "Your instance is running." in page and lease.ssh_command in page
    assert 'id="ssh-demo"' in page  # the fake host agent: the line answers nowhere, and the page says so
    client.post(reverse("instance_action", args=[lease.pk, "stop"]))
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    status = page[page.index('id="lease-status"'):page.index('id="instance"')]
    assert "Your instance is running." not in status and lease.ssh_command not in status
    assert 'state-stopped' in status and "Stopped by you" in status
    assert "Stopped by you" in page[page.index('id="instance"'):]


def test_an_incident_that_affected_the_lease_stays_on_its_page(client, customer, lease):
    now = timezone.now()
    incident = incident_open(starts_at=now - timedelta(hours=2), reason="power", site=Site.objects.get(code="DFW-1"))
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert 'id="incident-banner"' in page and 'id="lease-incidents"' in page
    incident_close(incident=incident, ends_at=now - timedelta(hours=1))
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert 'id="incident-banner"' not in page  # no "out of service since" for an incident that ended
    listed = page[page.index('id="lease-incidents"'):]
    assert f"{now - timedelta(hours=2):%Y-%m-%d %H:%M}" in listed and f"{now - timedelta(hours=1):%Y-%m-%d %H:%M}" in listed
    # and on the lease's timeline, beside the term's deadlines: when it began and when it ended
    timeline = page[page.index('class="tl-list"'):]
    timeline = timeline[:timeline.index("</ol>")]
    began = timeline[timeline.index("Incident: out of service"):].split("</li>")[0]
    over = timeline[timeline.index("Incident over"):].split("</li>")[0]
    assert f"{now - timedelta(hours=2):%Y-%m-%d %H:%M}" in began and f"{now - timedelta(hours=1):%Y-%m-%d %H:%M}" in over


def test_the_sla_form_offers_only_months_with_an_affected_lease(client, customer, lease):
    client.force_login(customer)
    assert "No month is open for claims right now." in client.get(reverse("sla:claims")).content.decode()
    first = timezone.now().replace(day=1, hour=12, minute=0, second=0, microsecond=0)
    last_month = (first - timedelta(days=1)).replace(day=5)
    incident = incident_open(starts_at=last_month, reason="node died", site=Site.objects.get(code="DFW-1"))
    incident_close(incident=incident, ends_at=last_month + timedelta(hours=3))
    page = client.get(reverse("sla:claims")).content.decode()
    assert f'value="{last_month:%Y-%m}"' in page and "No month is open" not in page


def test_every_storage_price_is_on_the_storage_pages(client, catalog, customer, settings):
    settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH = 1234
    public = client.get(reverse("storage")).content.decode()
    assert 'id="object-storage-price"' in public and "$12.34" in public
    client.force_login(customer)
    mine = client.get(reverse("storage_mine:index")).content.decode()
    assert 'id="object-price"' in mine and "$12.34" in mine


def test_a_notice_email_names_the_store_and_links_to_the_lease(customer, lease, settings,
                                                               django_capture_on_commit_callbacks):
    settings.OPERATOR_NAME, settings.PUBLIC_URL = "Example GPUs", "https://gpus.example"
    customer.email = "alice@example.com"
    customer.save()
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        notify(lease=lease, kind="connection_changed", deadline=timezone.now(), subject="s", body="b")
    [sent] = mail.outbox
    assert "Example GPUs" in sent.body and f"https://gpus.example/leases/{lease.pk}/" in sent.body
