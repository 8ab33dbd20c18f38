"""The order page, invoices, balance and refund through the HTML views."""
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice, LedgerEntry
from billing.services import balance_top_up, topup_invoice_create
from inventory.models import GpuSlot, Offer, SlotAllocation
from ops.lifecycle import run_lifecycle
from rental.models import Lease, LeaseState
from tests.factories import RSA_1024, form_data, order_url, place

DSA = ("ssh-dss AAAAB3NzaC1kc3MAAACBAL0pvDjfq1lhuQwh5AIzjbd7XxNoQYOS33kH3tjcBl1kQr7aTCUanohsfDBVYsOtuyt2QG4AtHOi5+I7"
       "W9ltM6qdhJegrLa6QOYbRj6i4xkZ/EEXeQvJYRQVU9HCa0CViBxySHVYOs4lSBNCKGrO80JpYN1ubNTSJaHkfy4En7khAAAAFQDfCGH8Qjs8C+"
       "MQbRNQ1n+uDKudWQ== dsa@old")


@pytest.fixture
def alice(client, customer):
    client.force_login(customer)
    return client


def nothing_created():
    return not Lease.objects.exists() and not Invoice.objects.exists()


# --- order page -------------------------------------------------------------------------------

def test_order_page_requires_login(client, catalog):
    response = client.get(order_url())
    assert response.status_code == 302 and reverse("login") in response["Location"]


def test_order_page_shows_total_per_gpu_hour_timeline_and_vendor_images(alice, catalog):
    response = alice.get(order_url(), {"term": "week", "extra_nvme_tb": "2"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "$65.00" in html and "$4.20" in html and "$69.20" in html  # 2 TB × ceil(900 × 7/30)
    assert "$0.32" in html  # 23000 / 720 / 1
    assert "<svg" in html and "Renewal invoice issued" in html and "wiped (at the latest 7 days after the stop)" in html
    assert "pytorch-2.5-cuda-12.4" in html and "rocm" not in html
    amd = alice.get(order_url("mi300x")).content.decode()
    assert "pytorch-2.5-rocm-6.4" in amd and "cuda-12.4" not in amd


def test_order_page_htmx_returns_the_summary_fragment(alice, catalog):
    response = alice.get(order_url(), {"term": "month", "extra_nvme_tb": "1"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert html.lstrip().startswith('<div id="order-summary"') and "$239.00" in html  # 230 + 9
    assert '<section id="order-when" class="order-when" hx-swap-oob="true">' in html  # its timeline too


def test_order_page_offers_no_snapshot_addon_and_charges_none(alice, catalog, customer):
    """Snapshots are taken from the lease; the order page neither offers nor prices them, and a
    forged snapshot_tb in the POST orders nothing of it."""
    html = alice.get(order_url(), {"term": "week"}).content.decode()
    assert 'name="extra_nvme_tb"' in html and 'name="network_volume_tb"' in html
    assert 'name="snapshot_tb"' not in html and "Snapshots (TB)" not in html
    summary = alice.get(order_url(), {"term": "month", "snapshot_tb": "3"}, HTTP_HX_REQUEST="true").content.decode()
    assert "$230.00" in summary and "Snapshot" not in summary
    response = alice.post(order_url(), form_data(snapshot_tb="2"))
    assert response.status_code == 302
    lease = Lease.objects.get()
    assert lease.snapshot_tb == 0
    invoice = Invoice.objects.get(lease=lease)
    assert invoice.amount_cents == 6500 and not invoice.lines.filter(description__startswith="Snapshot").exists()


def test_old_lease_that_paid_for_snapshot_tb_still_shows_it(alice, catalog, customer):
    lease, _ = place(customer)
    assert "(ordered with the lease)" not in alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    Lease.objects.filter(pk=lease.pk).update(snapshot_tb=2)  # ordered before the add-on was retired
    html = alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert '<span id="lease-snapshot-addon">snapshots 2 TB (ordered with the lease)</span>' in html


def test_order_page_sold_out_when_no_site_has_stock(alice, catalog, customer):
    balance_top_up(customer=customer, amount_cents=400_000, now=timezone.now())
    place(customer, "8x-mi300x", pay=True)  # an unpaid order may not take a whole SKU
    response = alice.get(order_url("8x-mi300x"))
    assert response.status_code == 200 and "is sold out" in response.content.decode()


def test_order_pay_from_balance_then_provisioning_then_ssh(alice, catalog, customer, settings):
    settings.HOST_AGENT_FAKE_DELAY = 180
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    response = alice.post(order_url(), form_data(pay_from_balance="on"))
    lease = Lease.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("lease_detail", args=[lease.pk])
    assert lease.state == LeaseState.PROVISIONING and lease.invoices.get().state == Invoice.State.PAID
    page = alice.get(response["Location"]).content.decode()
    assert "Provisioning" in page and 'hx-trigger="every 3s"' in page and "ssh -p" not in page
    run_lifecycle(timezone.now() + timedelta(minutes=3))
    partial = alice.get(response["Location"], HTTP_HX_REQUEST="true").content.decode()
    assert "ssh -p" in partial and "hx-trigger" not in partial and "<html" not in partial


def test_insufficient_balance_refuses_the_whole_order(alice, catalog, customer):
    balance_top_up(customer=customer, amount_cents=1000, now=timezone.now())
    response = alice.post(order_url(), form_data(pay_from_balance="on"))
    assert response.status_code == 400 and "Nothing was ordered" in response.content.decode()
    assert nothing_created() and not SlotAllocation.objects.exists()


def test_order_without_payment_leaves_a_pending_lease_holding_its_slot(alice, catalog):
    response = alice.post(order_url(), form_data(term="month", network_volume_tb="1"))
    lease = Lease.objects.get()
    assert response.status_code == 302 and lease.state == LeaseState.PENDING
    assert lease.invoices.get().amount_cents == 23000 + 1400
    assert SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).count() == 1


def test_just_sold_out_is_409_and_nothing_is_created(alice, catalog, other_customer):
    offer = Offer.objects.get(slug="8x-mi300x")
    GpuSlot.objects.filter(node__gpu_model=offer.gpu_model).exclude(node__site__code="DFW-1").update(in_service=False)
    page = alice.get(order_url("8x-mi300x"))
    assert page.status_code == 200
    balance_top_up(customer=other_customer, amount_cents=400_000, now=timezone.now())
    place(other_customer, "8x-mi300x", pay=True)  # someone else takes the last node meanwhile
    leases, invoices = Lease.objects.count(), Invoice.objects.count()
    response = alice.post(order_url("8x-mi300x"), form_data(image="pytorch-2.5-rocm-6.4"))
    assert response.status_code == 409
    assert "Just sold out — this card was taken a moment ago; nothing was charged" in response.content.decode()
    assert Lease.objects.count() == leases and Invoice.objects.count() == invoices


@pytest.mark.parametrize("key, message", [
    ("not a key at all", "Unsupported key type"),
    ("ssh-ed25519 !!!notbase64", "not valid base64"),
    (RSA_1024, "1024 bits; at least 2048"),
    (DSA, "Unsupported key type “ssh-dss”"),
    ("ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P", "does not match its type"),
])
def test_invalid_ssh_keys_are_rejected_with_a_message(alice, catalog, key, message):
    response = alice.post(order_url(), form_data(ssh_public_key=key))
    assert response.status_code == 400 and message in response.content.decode()
    assert nothing_created()


def test_image_of_the_other_vendor_is_refused(alice, catalog):
    response = alice.post(order_url(), form_data(image="pytorch-2.5-rocm-6.4"))
    assert response.status_code == 400 and nothing_created()


def test_addon_limits(alice, catalog):
    response = alice.post(order_url(), form_data(extra_nvme_tb="31"))
    assert response.status_code == 400 and nothing_created()


def test_preview_button_recomputes_without_ordering(alice, catalog):
    response = alice.post(order_url(), form_data(term="month", extra_nvme_tb="1", preview="1"))
    assert response.status_code == 200 and "$239.00" in response.content.decode() and nothing_created()


# --- refund -----------------------------------------------------------------------------------

def test_refund_button_within_the_hour(alice, catalog, customer):
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    lease, _ = place(customer, pay=True)
    page = alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert reverse("billing:lease_refund", args=[lease.pk]) in page
    response = alice.post(reverse("billing:lease_refund", args=[lease.pk]), follow=True)
    lease.refresh_from_db()
    assert lease.state == LeaseState.CANCELLED and "$65.00 returned to your balance" in response.content.decode()
    assert LedgerEntry.objects.filter(kind="refund", amount_cents=6500).exists()


def test_refund_refused_after_the_hour(alice, catalog, customer):
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    lease, _ = place(customer, pay=True)
    Lease.objects.filter(pk=lease.pk).update(created_at=timezone.now() - timedelta(minutes=61))
    page = alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert reverse("billing:lease_refund", args=[lease.pk]) not in page
    response = alice.post(reverse("billing:lease_refund", args=[lease.pk]), follow=True)
    lease.refresh_from_db()
    assert lease.state == LeaseState.PROVISIONING
    assert "Refund refused: Refunds are possible within 60 minutes" in response.content.decode()


def test_refund_of_another_customers_lease_is_404(client, catalog, customer, other_customer):
    lease, _ = place(customer)
    client.force_login(other_customer)
    assert client.post(reverse("billing:lease_refund", args=[lease.pk])).status_code == 404
    lease.refresh_from_db()
    assert lease.state == LeaseState.PENDING


# --- invoices and balance -----------------------------------------------------------------------

def test_invoice_pages_for_owner_and_404_for_others(client, catalog, customer, other_customer):
    _, invoice = place(customer)
    client.force_login(customer)
    assert client.get(reverse("billing:invoices")).status_code == 200
    page = client.get(reverse("billing:invoice", args=[invoice.pk]))
    assert page.status_code == 200 and "Awaiting payment" in page.content.decode()
    client.force_login(other_customer)
    assert client.get(reverse("billing:invoice", args=[invoice.pk])).status_code == 404
    assert client.post(reverse("billing:invoice_pay", args=[invoice.pk])).status_code == 404
    assert f"#{invoice.pk}" not in client.get(reverse("billing:invoices")).content.decode()


def test_pay_open_invoice_from_balance(alice, catalog, customer):
    _, invoice = place(customer)
    balance_top_up(customer=customer, amount_cents=7000, now=timezone.now())
    page = alice.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
    assert "Pay $65.00 from balance" in page
    alice.post(reverse("billing:invoice_pay", args=[invoice.pk]))
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.PAID and invoice.lease.state == LeaseState.PROVISIONING


def test_balance_page_ledger_and_topup_invoice(alice, catalog, customer):
    balance_top_up(customer=customer, amount_cents=2500, now=timezone.now(), memo="welcome")
    page = alice.get(reverse("billing:balance"))
    assert page.status_code == 200 and "$25.00" in page.content.decode() and "welcome" in page.content.decode()
    response = alice.post(reverse("billing:balance"), {"amount": "50"})
    invoice = Invoice.objects.get(kind="topup")
    assert response.status_code == 302 and invoice.amount_cents == 5000
    assert alice.post(reverse("billing:balance"), {"amount": "0.5"}).status_code == 400


def test_topup_invoice_cannot_be_paid_from_balance(alice, catalog, customer):
    invoice = topup_invoice_create(customer=customer, amount_cents=1000)
    balance_top_up(customer=customer, amount_cents=5000, now=timezone.now())
    page = alice.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
    assert "from balance (" not in page and "Awaiting payment" in page
