"""A free account cannot hold the whole stock (issue 16 point 3): at most
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
from rental.models import Lease, LeaseState
from rental.services_customer import api_token_create
from tests.billing.test_pages import form_data, order_url, place

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
        assert response.status_code == 200, n
    response = Client(REMOTE_ADDR="203.0.113.7").post(
        reverse("signup"), {"username": "hoarder9", "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 429 and "Too many new accounts" in response.content.decode()
    assert not User.objects.filter(username="hoarder9").exists()
    # Another address is not affected.
    response = Client(REMOTE_ADDR="198.51.100.2").post(
        reverse("signup"), {"username": "someone", "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 200


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
