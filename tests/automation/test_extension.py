"""Extending a lease by one term (the renewal invoice of the next term, paid now) and the
per-lease auto-renew that the account's checkbox only defaults."""
from datetime import timedelta

import pytest

from billing.models import Invoice
from billing.renewals import lease_extend_order
from billing.services import BillingError, InsufficientBalance, account_for
from ops.lifecycle import run_lifecycle
from rental.accounts.services import api_token_create
from rental.models import LeaseEvent, Notification
from rental.services import customer_settings_update, lease_auto_renew_set, lease_auto_renews

from .helpers import WEEK, active_lease, call, drain_balance

pytestmark = pytest.mark.django_db


def test_extend_from_balance_pays_the_next_term_at_the_locked_price_and_again(catalog, customer, t0):
    lease = active_lease(customer, t0)
    first_end = lease.ends_at
    balance = account_for(customer).balance_cents
    invoice = lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=t0 + timedelta(hours=1))
    lease.refresh_from_db()
    assert (invoice.kind, invoice.state, invoice.term_start) == ("renewal", "paid", first_end)
    assert invoice.amount_cents == lease.price_cents == 6500
    assert lease.ends_at == first_end + WEEK
    assert account_for(customer).balance_cents == balance - 6500
    # The next "extend" invoices the term after that one.
    second = lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=t0 + timedelta(hours=2))
    lease.refresh_from_db()
    assert second.pk != invoice.pk and second.term_start == first_end + WEEK
    assert lease.ends_at == first_end + 2 * WEEK
    assert list(LeaseEvent.objects.filter(lease=lease, kind="extended").values_list("data__term_start", flat=True)) \
        == [first_end.isoformat(), (first_end + WEEK).isoformat()]


def test_extend_is_one_invoice_per_term_shared_with_the_renewal_sweep(catalog, customer, t0):
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)
    a = lease_extend_order(lease=lease, actor=customer, now=t0 + timedelta(hours=1))
    b = lease_extend_order(lease=lease, actor=customer, now=t0 + timedelta(hours=2))
    assert a.pk == b.pk and a.state == Invoice.State.OPEN
    run_lifecycle(lease.ends_at - timedelta(hours=23))  # the renewal sweep's moment
    assert Invoice.objects.filter(lease=lease, kind="renewal").count() == 1
    assert Notification.objects.filter(lease=lease, kind="renewal_invoice").count() == 1
    with pytest.raises(InsufficientBalance):
        lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=t0 + timedelta(hours=3))
    a.refresh_from_db()
    assert a.state == Invoice.State.OPEN  # nothing half-paid


def test_extend_refused_for_a_pending_lease_someone_else_or_too_far_ahead(catalog, customer, other_customer, t0,
                                                                          settings):
    lease = active_lease(customer, t0)
    with pytest.raises(BillingError, match="Only the lease's customer"):
        lease_extend_order(lease=lease, actor=other_customer, now=t0)
    settings.LEASE_EXTEND_MAX_AHEAD_DAYS = 10
    lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=t0)  # 7 days ahead: fine
    with pytest.raises(BillingError, match="extend it again closer"):
        lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=t0)  # 14 days ahead


def test_lease_auto_renew_overrides_the_account_default_both_ways(catalog, customer, t0):
    lease = active_lease(customer, t0, balance_cents=20_000)
    assert lease_auto_renews(lease) is True  # the account's default (on)
    assert lease_auto_renew_set(customer=customer, lease_id=lease.pk, auto_renew=False, now=t0)
    lease.refresh_from_db()
    run_lifecycle(lease.ends_at - timedelta(hours=23))
    renewal = Invoice.objects.get(lease=lease, kind="renewal")
    assert renewal.state == Invoice.State.OPEN  # balance covers it, but this lease said no
    assert LeaseEvent.objects.filter(lease=lease, kind="auto_renew_set", data__auto_renew=False).exists()

    other = active_lease(customer, t0, balance_cents=20_000)
    customer_settings_update(user=customer, email=customer.email, auto_renew=False)
    lease_auto_renew_set(customer=customer, lease_id=other.pk, auto_renew=True, now=t0)
    other.refresh_from_db()
    run_lifecycle(other.ends_at - timedelta(hours=23))
    assert Invoice.objects.get(lease=other, kind="renewal").state == Invoice.State.PAID  # on for this one


def test_lease_page_forms_work_without_javascript(client, catalog, customer, t0):
    lease = active_lease(customer, t0)
    client.force_login(customer)
    page = client.get(f"/leases/{lease.pk}/").content.decode()
    assert f'action="/billing/leases/{lease.pk}/extend/"' in page and 'name="pay" value="balance"' in page
    assert f'action="/leases/{lease.pk}/auto-renew/"' in page
    end = lease.ends_at
    response = client.post(f"/billing/leases/{lease.pk}/extend/", {"pay": "balance"})
    assert response.status_code == 302 and response["Location"] == f"/leases/{lease.pk}/"
    lease.refresh_from_db()
    assert lease.ends_at == end + WEEK
    response = client.post(f"/billing/leases/{lease.pk}/extend/", {"pay": "invoice"})
    invoice = Invoice.objects.get(lease=lease, kind="renewal", term_start=end + WEEK)
    assert response["Location"] == f"/pay/invoice/{invoice.pk}/" and invoice.state == "open"
    assert client.post(f"/leases/{lease.pk}/auto-renew/", {"auto_renew": "off"}).status_code == 302
    lease.refresh_from_db()
    assert lease.auto_renew is False
    assert client.post(f"/leases/{lease.pk}/auto-renew/", {"auto_renew": "maybe"}).status_code == 302
    lease.refresh_from_db()
    assert lease.auto_renew is False  # refused with a message, unchanged


def test_lease_page_in_chinese_has_the_renewal_strings_translated(client, catalog, customer, t0):
    lease = active_lease(customer, t0)
    client.force_login(customer)
    client.cookies["django_language"] = "zh-hans"
    page = client.get(f"/leases/{lease.pk}/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "Auto-renew from the balance" not in page and "Pay from balance" not in page


def test_api_extend_and_auto_renew_with_scopes(client, catalog, customer, other_customer, t0):
    lease = active_lease(customer, t0)
    read_order = api_token_create(customer=customer, name="ro", scopes=["read", "order"])[1]
    full = api_token_create(customer=customer, name="all")[1]
    bob = api_token_create(customer=other_customer, name="bob")[1]
    url = f"/api/v1/leases/{lease.pk}/extend"
    assert call(client, "post", url, read_order, {"pay_from_balance": True}).status_code == 403
    assert call(client, "post", url, bob, {}).status_code == 404
    assert call(client, "post", url, full, {"pay_from_balance": "yes"}).status_code == 400
    done = call(client, "post", url, full, {"pay_from_balance": True})
    assert done.status_code == 201
    body = done.json()
    assert body["invoice"]["state"] == "paid" and body["invoice"]["term_start"] == lease.ends_at.isoformat()
    assert body["lease"]["ends_at"] == (lease.ends_at + WEEK).isoformat()
    unpaid = call(client, "post", url, read_order, {}).json()
    assert unpaid["invoice"]["state"] == "open"
    assert call(client, "post", url, read_order, {}).json()["invoice"]["id"] == unpaid["invoice"]["id"]

    ar = f"/api/v1/leases/{lease.pk}/auto-renew"
    assert call(client, "post", ar, full, {"auto_renew": "off"}).status_code == 400
    off = call(client, "post", ar, full, {"auto_renew": False}).json()
    assert off["auto_renew"] is False and off["auto_renew_setting"] is False
    default = call(client, "post", ar, full, {"auto_renew": None}).json()
    assert default["auto_renew"] is True and default["auto_renew_setting"] is None
