"""Customers never see or touch each other's things: every customer-facing URL and API
object of one customer, fetched (or posted to) as another, is a 404 and changes nothing;
lists show only one's own. Also: the admin is refused to non-staff."""

import pytest
from django.urls import reverse

from billing.models import Invoice, Quote
from rental.accounts.services import api_token_create
from rental.models import ApiToken, Lease, Notification

pytestmark = pytest.mark.django_db


@pytest.fixture
def bob(client, other_customer):
    client.force_login(other_customer)
    return client


@pytest.fixture
def bob_api(client, other_customer):
    _token, raw = api_token_create(customer=other_customer, name="bob")
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def page_urls(a):
    lease, invoice, quote = a["lease"].pk, a["invoice"].pk, a["quote"].pk
    return [
        ("get", reverse("lease_detail", args=[lease])),
        ("get", reverse("billing:invoice", args=[invoice])),
        ("get", reverse("payments:invoice", args=[invoice])),
        ("post", reverse("payments:invoice", args=[invoice])),
        ("get", reverse("payments:quote", args=[quote])),
        ("post", reverse("payments:confirm_late", args=[quote])),
        ("post", reverse("billing:invoice_pay", args=[invoice])),
        ("post", reverse("billing:lease_refund", args=[lease])),
        ("post", reverse("token_revoke", args=[a["token"].pk])),
    ]


def snapshot(a):
    return (Lease.objects.get(pk=a["lease"].pk).state, Invoice.objects.get(pk=a["invoice"].pk).state,
            Quote.objects.count(), Quote.objects.get(pk=a["quote"].pk).state,
            ApiToken.objects.get(pk=a["token"].pk).revoked_at, Notification.objects.get(pk=a["notification"].pk).read_at)


def test_every_customer_page_of_another_customer_is_404(alices, bob):
    before = snapshot(alices)
    for method, url in page_urls(alices):
        data = {"coin": "LTC"} if method == "post" else None
        response = getattr(bob, method)(url, data) if data else getattr(bob, method)(url)
        assert response.status_code == 404, (method, url, response.status_code)
    assert snapshot(alices) == before


def test_the_htmx_partials_of_another_customer_are_404(alices, bob):
    for url in (reverse("lease_detail", args=[alices["lease"].pk]), reverse("payments:quote", args=[alices["quote"].pk])):
        assert bob.get(url, HTTP_HX_REQUEST="true").status_code == 404, url


def test_marking_another_customers_notification_read_changes_nothing(alices, bob):
    response = bob.post(reverse("notification_read", args=[alices["notification"].pk]))
    assert response.status_code in (302, 404)  # the view answers like for an unknown id
    assert Notification.objects.get(pk=alices["notification"].pk).read_at is None
    bob.post(reverse("notifications_read_all"))
    assert Notification.objects.get(pk=alices["notification"].pk).read_at is None


def test_lists_show_only_ones_own(alices, bob):
    lease, invoice = alices["lease"], alices["invoice"]
    leases = bob.get(reverse("lease_list")).content.decode()
    assert reverse("lease_detail", args=[lease.pk]) not in leases
    invoices = bob.get(reverse("billing:invoices")).content.decode()
    assert reverse("billing:invoice", args=[invoice.pk]) not in invoices
    settings_page = bob.get(reverse("account_settings")).content.decode()
    assert alices["token"].prefix not in settings_page and "laptop" not in settings_page


def test_every_api_object_of_another_customer_is_404(alices, client, bob_api):
    lease, invoice = alices["lease"].pk, alices["invoice"].pk
    for method, url in [("get", reverse("api_lease", args=[lease])), ("post", reverse("api_lease_refund", args=[lease])),
                        ("get", reverse("api_invoice", args=[invoice]))]:
        response = getattr(client, method)(url, **bob_api)
        assert response.status_code == 404 and response.json()["error"] == "not_found", (method, url)
    assert client.get(reverse("api_leases"), **bob_api).json() == {"leases": []}
    assert Lease.objects.get(pk=lease).state == alices["lease"].state


def test_api_tokens_are_not_sessions(alices, bob):
    """A logged-in browser session gives no API access: the API only takes bearer tokens."""
    assert bob.get(reverse("api_leases")).status_code == 401


def test_admin_is_refused_to_non_staff(client, customer, catalog):
    client.force_login(customer)
    for url in ("/admin/", "/admin/rental/lease/", "/admin/billing/invoice/", "/admin/auth/user/"):
        response = client.get(url)
        assert response.status_code == 302 and reverse("admin:login") in response["Location"], url
    anonymous = client.__class__()
    assert anonymous.get("/admin/").status_code == 302
