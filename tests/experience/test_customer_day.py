"""The customer's day without dead ends: sign-up returns to the page that asked, the
invoice list is in reach, refunds ask first and show on the invoice, the balance is
preselected when it pays the order, the event log reads as sentences, and the trust pages
(status, SLA, terms, privacy, contact) are linked from every page."""
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice, LedgerEntry
from billing.services import balance_top_up
from billing.sla.services import BANDS, SLA_TARGET
from inventory.incidents import incident_open
from inventory.models import Node, Offer, Site
from rental.models import LeaseState
from tests.factories import order_url, place


@pytest.fixture
def alice(client, customer):
    client.force_login(customer)
    return client


def test_signup_returns_to_the_page_that_asked_for_an_account(client, catalog):
    target = order_url()
    login_page = client.get(target, follow=True).content.decode()
    assert f"{reverse('signup')}?next=" in login_page  # the login page passes `next` on
    response = client.post(f"{reverse('signup')}?next={target}",
                           {"username": "newbie", "password1": "a long pass phrase 42", "password2":
                            "a long pass phrase 42", "next": target}, follow=True)
    # The recovery codes come first (shown once); their "continue" goes back to the order.
    assert response.status_code == 200 and f'href="{target}"' in response.content.decode()


def test_signup_ignores_a_next_on_another_site(client, db):
    response = client.post(reverse("signup"), {"username": "newbie", "password1": "a long pass phrase 42",
                                               "password2": "a long pass phrase 42",
                                               "next": "https://evil.example/phish"}, follow=True)
    page = response.content.decode()
    assert "evil.example" not in page and f'href="{reverse("home")}"' in page


def test_invoices_are_in_the_navigation_and_billing_is_not_a_404(alice, catalog, customer):
    place(customer)
    assert reverse("billing:invoices") in alice.get(reverse("lease_list")).content.decode()
    response = alice.get("/billing/")
    assert response.status_code == 302 and response["Location"] == reverse("billing:invoices")


def test_refund_asks_for_confirmation_then_refunds_and_the_invoice_says_so(alice, catalog, customer):
    balance_top_up(customer=customer, amount_cents=100_00, now=timezone.now())
    lease = place(customer, pay=True)[0]
    confirm = alice.get(reverse("billing:lease_refund", args=[lease.pk]))
    assert confirm.status_code == 200 and "Yes, cancel and refund" in confirm.content.decode()
    lease.refresh_from_db()
    assert lease.state != LeaseState.CANCELLED and not LedgerEntry.objects.filter(kind="refund").exists()

    alice.post(reverse("billing:lease_refund", args=[lease.pk]))
    invoice = Invoice.objects.get(lease=lease)
    assert invoice.refunded_at is not None
    assert "refunded" in alice.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
    assert "refunded" in alice.get(reverse("billing:invoices")).content.decode()


def test_pay_from_balance_is_preselected_only_when_the_balance_covers_the_order(alice, catalog, customer):
    checkbox = 'name="pay_from_balance"'
    page = alice.get(order_url()).content.decode()
    assert checkbox in page and f'{checkbox} checked' not in page.replace('checked id', 'checked')
    price = Offer.objects.get(slug="rtx-3090").monthly_cents
    balance_top_up(customer=customer, amount_cents=price, now=timezone.now())
    page = alice.get(order_url()).content.decode()
    tag = page[page.index(checkbox) - 200: page.index(checkbox) + 200]
    assert "checked" in tag


def test_event_log_reads_as_sentences_not_codes(alice, catalog, customer):
    lease = place(customer)[0]
    page = alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert "Order placed" in page and "pending payment" in page
    assert ">created<" not in page and "— →" not in page


def test_event_log_in_chinese(alice, catalog, customer):
    lease = place(customer)[0]
    page = alice.get(reverse("lease_detail", args=[lease.pk]), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "Order placed" not in page and "order placed" not in page


def test_ssh_line_has_a_copy_button(alice, catalog, customer):
    lease = place(customer)[0]
    now = timezone.now()
    lease.state, lease.host, lease.ssh_port = LeaseState.ACTIVE, "node7.example", 22042
    lease.started_at, lease.ends_at = now, now + timedelta(days=7)
    lease.save()
    page = alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert 'data-copy="ssh -p 22042 root@node7.example"' in page and "js/copy.js" in page


@pytest.mark.parametrize("name", ["status", "sla_terms", "terms", "privacy"])
def test_trust_pages_are_linked_from_every_page_and_serve(client, catalog, name, settings):
    settings.OPERATOR_CONTACT = "ops@gpus.example"
    home = client.get(reverse("home")).content.decode()
    assert reverse(name) in home and "ops@gpus.example" in home
    assert client.get(reverse(name)).status_code == 200


def test_sla_page_states_the_bands_that_compute_credits(client, db):
    page = client.get(reverse("sla_terms")).content.decode()
    assert f"{float(SLA_TARGET * 100):g}%" in page
    for below, mult in BANDS:
        assert f"below {float(below * 100):g}%" in page
        assert (f"{mult}× the value" if mult else "the whole month") in page


def test_status_page_shows_open_incidents_per_site(client, catalog):
    now = timezone.now()
    dfw, iad = Site.objects.get(code="DFW-1"), Site.objects.get(code="IAD-1")
    incident_open(site=dfw, starts_at=now - timedelta(minutes=5), reason="power")
    incident_open(node=Node.objects.filter(site=iad).first(), kind="degraded",
                  starts_at=now - timedelta(minutes=5), reason="fan")
    page = client.get(reverse("status")).content.decode()
    rows = {code: page[page.index(f">{code} ("):][:400] for code in ("DFW-1", "IAD-1", "PDX-1")}
    assert "outage" in rows["DFW-1"] and "partly degraded" in rows["IAD-1"] and "operational" in rows["PDX-1"]
    assert "power" not in page  # operators' reasons can name customers or hardware: not public
