"""A free account cannot hold the whole stock: at most
MAX_OPEN_UNPAID_ORDERS unpaid orders per account (web page and API), a shorter hold for
accounts that never paid, sign-ups throttled per client address, and an admin page that
shows who holds which GPUs until when."""
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice
from billing.services import TooManyOpenOrders, balance_top_up, invoice_mark_paid
from inventory.models import SlotAllocation
from rental.accounts.services import api_token_create
from rental.models import Lease, LeaseState
from tests.factories import form_data, order_url, place

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery 9"


@pytest.fixture(autouse=True)
def fresh_throttles():
    cache.clear()
    yield
    cache.clear()


def test_the_third_unpaid_order_is_refused_and_holds_nothing(catalog, customer, settings):
    assert settings.MAX_OPEN_UNPAID_ORDERS == 2  # the shipped default
    place(customer)
    place(customer)
    held = SlotAllocation.objects.filter(released_at__isnull=True).count()
    with pytest.raises(TooManyOpenOrders):
        place(customer)
    assert Lease.objects.filter(customer=customer).count() == 2
    assert SlotAllocation.objects.filter(released_at__isnull=True).count() == held


def test_the_limit_on_the_order_page_and_the_api(client, catalog, customer):
    client.force_login(customer)
    for _ in range(2):
        assert client.post(order_url(), form_data()).status_code == 302
    response = client.post(order_url(), form_data())
    assert response.status_code == 409 and "unpaid orders holding GPUs" in response.content.decode()

    raw = api_token_create(customer=customer, name="bot")[1]
    body = {"offer": "rtx-3090", "site": "DFW-1", "term": "week", "ssh_key": form_data()["ssh_public_key"]}
    response = client.post(reverse("api_orders"), data=json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 409 and response.json()["error"] == "too_many_unpaid_orders"
    assert Lease.objects.filter(customer=customer).count() == 2


def test_paying_frees_a_place_and_paying_from_the_balance_is_never_refused(catalog, customer):
    first, invoice = place(customer)
    place(customer)
    balance_top_up(customer=customer, amount_cents=100_000_00, now=timezone.now())
    lease, _ = place(customer, pay=True)  # holds nothing unpaid
    lease.refresh_from_db()
    assert lease.state != LeaseState.PENDING
    invoice_mark_paid(invoice=invoice, via="manual", now=timezone.now())
    place(customer)  # one of the two unpaid ones is paid now


def test_an_account_that_never_paid_holds_for_less(catalog, customer, other_customer, settings):
    lease, invoice = place(customer)
    held = invoice.expires_at - lease.created_at
    assert abs(held - timedelta(minutes=settings.PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES)) < timedelta(seconds=5)
    assert lease.pay_by == invoice.expires_at

    balance_top_up(customer=other_customer, amount_cents=100_000_00, now=timezone.now())
    paid_lease, _ = place(other_customer, pay=True)
    assert Invoice.objects.filter(customer=other_customer, state=Invoice.State.PAID).exists()
    lease, invoice = place(other_customer)
    held = invoice.expires_at - lease.created_at
    assert abs(held - timedelta(minutes=settings.PAYMENT_WINDOW_MINUTES)) < timedelta(seconds=5)


def test_sign_ups_are_throttled_per_address(db, settings):
    settings.SIGNUPS_PER_IP = 3
    for n in range(3):
        response = Client(REMOTE_ADDR="203.0.113.7").post(
            reverse("signup"), {"username": f"hoarder{n}", "password1": PASSWORD, "password2": PASSWORD})
        assert response.status_code == 302, n  # made: on to its recovery codes
    response = Client(REMOTE_ADDR="203.0.113.7").post(
        reverse("signup"), {"username": "hoarder9", "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 429 and "Too many new accounts" in response.content.decode()
    assert not User.objects.filter(username="hoarder9").exists()
    # Another address is not affected.
    response = Client(REMOTE_ADDR="198.51.100.2").post(
        reverse("signup"), {"username": "someone", "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 302


def test_operators_see_who_holds_what(client, operator, catalog, customer, other_customer):
    mine, _ = place(customer)
    second, _ = place(customer)
    theirs, _ = place(other_customer)
    client.force_login(operator)
    page = client.get(reverse("admin:ops_holds"))
    assert page.status_code == 200
    html = page.content.decode()
    slots = SlotAllocation.objects.filter(lease_id=mine.pk, released_at__isnull=True).select_related("slot__node")
    assert all(f"{a.slot.node.name}/gpu{a.slot.index}" in html for a in slots)
    assert f"#{mine.pk}" in html and f"#{theirs.pk}" in html
    assert f"{mine.pay_by:%Y-%m-%d %H:%M}" in html
    holds = page.context["holds"]
    assert {(h.lease.pk, h.customer_open_orders, len(h.slots)) for h in holds} == {
        (mine.pk, 2, 1), (second.pk, 2, 1), (theirs.pk, 1, 1)}
    assert reverse("admin:ops_holds") in client.get(reverse("admin:index")).content.decode()


# --- GPUs, not orders; per account and per address; a cool-down after an expiry --------

def order(customer, slug, *, address=None, now=None):
    from billing.services import checkout_place_order
    from inventory.models import Offer, Site
    from inventory.selectors import sites_with_stock_for
    from rental.models import Image
    from tests.factories import ED25519

    offer = Offer.objects.get(slug=slug)
    site = Site.objects.get(code=sorted(sites_with_stock_for(offer))[0])
    return checkout_place_order(customer=customer, offer=offer, site=site, term="week", now=now,
                                image=Image.objects.filter(vendor=offer.gpu_model.vendor).first(),
                                ssh_public_key=ED25519, client_address=address)


def test_the_unpaid_limit_counts_gpus_per_account(catalog, customer, settings):
    settings.MAX_UNPAID_GPUS_PER_ACCOUNT = 3
    order(customer, "2x-a100-sxm")
    with pytest.raises(TooManyOpenOrders, match="already hold 2 GPUs"):
        order(customer, "2x-a100-sxm")  # one order only, but 4 GPUs
    order(customer, "rtx-3090")  # 3 GPUs: within the limit
    assert Lease.objects.filter(customer=customer, state=LeaseState.PENDING).count() == 2


def test_accounts_from_one_address_share_its_gpu_limit(catalog, customer, other_customer, settings):
    settings.MAX_UNPAID_GPUS_PER_IP = 8
    third = User.objects.create_user(username="carol", password=PASSWORD)
    first, _ = order(customer, "8x-h100-sxm", address="203.0.113.7")
    assert first.ordered_from == "203.0.113.7"
    with pytest.raises(TooManyOpenOrders, match="your address"):
        order(other_customer, "8x-h100-sxm", address="203.0.113.7")
    order(third, "8x-h100-sxm", address="198.51.100.2")  # another address is not affected
    assert Lease.objects.filter(state=LeaseState.PENDING).count() == 2


def test_after_an_unpaid_order_expires_account_and_address_wait_a_cool_down(catalog, customer, other_customer,
                                                                              settings):
    from billing.services import order_invoice_expire

    settings.UNPAID_EXPIRY_COOLDOWN_MINUTES = 30
    settings.UNPAID_HOLD_MAX_SHARE_BPS, settings.UNPAID_HOLD_RESERVE_UNITS = 10_000, 0  # the whole SKU unpaid
    t0 = timezone.now()
    lease, invoice = order(customer, "8x-mi300x", address="203.0.113.7", now=t0)
    expired_at = invoice.expires_at + timedelta(seconds=1)
    assert order_invoice_expire(invoice=invoice, now=expired_at)
    one_tick_later = invoice.expires_at + timedelta(minutes=1)
    with pytest.raises(TooManyOpenOrders, match="expired at"):
        order(customer, "8x-mi300x", address="198.51.100.2", now=one_tick_later)
    with pytest.raises(TooManyOpenOrders, match="expired at"):
        order(other_customer, "8x-mi300x", address="203.0.113.7", now=one_tick_later)
    assert not Lease.objects.filter(state=LeaseState.PENDING).exists()
    later = invoice.expires_at + timedelta(minutes=31)
    order(customer, "8x-mi300x", address="203.0.113.7", now=later)
    # Paying from the balance holds nothing unpaid: never refused by the cool-down.
    balance_top_up(customer=other_customer, amount_cents=100_000_00, now=t0)
    paid, _ = place(other_customer, pay=True)
    paid.refresh_from_db()
    assert paid.state != LeaseState.PENDING


def test_the_order_page_records_and_counts_the_client_address(catalog, customer, other_customer, settings):
    settings.MAX_UNPAID_GPUS_PER_IP = 1
    first = Client(REMOTE_ADDR="203.0.113.9")
    first.force_login(customer)
    assert first.post(order_url(), form_data()).status_code == 302
    assert Lease.objects.get(customer=customer).ordered_from == "203.0.113.9"
    second = Client(REMOTE_ADDR="203.0.113.9")
    second.force_login(other_customer)
    response = second.post(order_url(), form_data())
    assert response.status_code == 409 and "your address" in response.content.decode()
    assert not Lease.objects.filter(customer=other_customer).exists()
