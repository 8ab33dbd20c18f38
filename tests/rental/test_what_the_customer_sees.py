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


def test_the_locked_price_shown_is_what_each_renewal_costs(client, catalog, customer, settings,
                                                           django_capture_on_commit_callbacks):
    """A network volume ordered with the lease is in the first invoice, then renews on its own
    term: the lease page's price per term is the renewals' price, with the volume's part apart."""
    from billing.services import checkout_place_order
    from inventory.models import Offer
    from rental.models import Image
    from storage.orders import lease_volume_addon_cents
    from tests.automation.helpers import KEY

    lease, invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="h100-sxm"), site=Site.objects.get(code="DFW-1"),
        term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
        addons={"extra_nvme_tb": 2, "network_volume_tb": 1}, pay_from_balance=False, now=timezone.now())
    assert invoice.amount_cents == lease.price_cents == 47500 + 2 * 210 + 327
    assert lease_volume_addon_cents(lease) == 327
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    shown = page[page.index('id="term-price"'):]
    shown = shown[:shown.index("</dd>")]
    assert "$479.20 per term (locked)" in shown and "plus $3.27" in shown and "$482.47" not in shown

    # Paid and provisioned on simulated storage: the volume exists and renews on its own; the
    # lease's price is then the shown one, and nothing is shown apart.
    from billing.services import balance_top_up, invoice_pay_from_balance
    from rental.lifecycle import sweep_provisioning

    settings.HOST_AGENT_FAKE_DELAY = 0
    with django_capture_on_commit_callbacks(execute=True):
        balance_top_up(customer=customer, amount_cents=invoice.amount_cents, now=timezone.now())
        invoice_pay_from_balance(invoice=invoice, actor=customer, now=timezone.now())
        sweep_provisioning(timezone.now())
    lease.refresh_from_db()
    assert lease.price_cents == 47920 and lease_volume_addon_cents(lease) == 0
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    shown = page[page.index('id="term-price"'):]
    assert "$479.20 per term (locked)" in shown[:shown.index("</dd>")] and "plus $" not in shown[:shown.index("</dd>")]
