"""The payment pages: coin picker, quote page (owner only), QR SVG, copy buttons without
inline JS, htmx status polling that stops once final, late-payment confirmation."""
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Invoice, Quote
from billing.payments.services import quote_create, sweep_expire_quotes
from tests.billing.payments_helpers import apply, fresh, offline_coins, paid, set_rate
from tests.factories import order

pytestmark = pytest.mark.urls("tests.billing.payments_urls")
DUE = 65_000_000


@pytest.fixture
def coins(db):
    with offline_coins():
        yield


@pytest.fixture
def invoice(catalog, customer, coins):
    now = timezone.now()
    set_rate("LTC", "100", now)
    return order(customer, now, pay=False)[1]


@pytest.fixture
def alice(client, customer):
    client.force_login(customer)
    return client


def test_coin_picker_lists_configured_coins_and_creates_a_quote(alice, invoice):
    page = alice.get(f"/pay/invoice/{invoice.pk}/")
    assert page.status_code == 200
    assert b'value="LTC"' in page.content and b'value="USDT"' in page.content and b'value="BTC"' not in page.content
    resp = alice.post(f"/pay/invoice/{invoice.pk}/", {"coin": "LTC"})
    quote = Quote.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/pay/quote/{quote.pk}/"


def test_refused_quote_shows_the_reason(alice, invoice):
    set_rate("LTC", "100", timezone.now() - timedelta(hours=1))
    resp = alice.post(f"/pay/invoice/{invoice.pk}/", {"coin": "LTC"}, follow=True)
    assert resp.status_code == 200 and b"out of date" in resp.content and not Quote.objects.exists()


def test_quote_page_for_its_owner_only(alice, client, invoice, other_customer):
    quote = quote_create(invoice=invoice, coin="LTC", now=timezone.now())
    page = alice.get(f"/pay/quote/{quote.pk}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "0.65" in html and quote.address in html and "<svg" in html and 'class="segno"' in html
    assert 'data-copy="0.65"' in html and "js/copy.js" in html and "onclick" not in html
    assert 'hx-trigger="every 5s"' in html and "Refresh" in html and "data-deadline" in html
    client.force_login(other_customer)
    assert client.get(f"/pay/quote/{quote.pk}/").status_code == 404
    assert client.get(f"/pay/invoice/{invoice.pk}/").status_code == 404


def test_htmx_partial_polls_until_settled_then_stops(alice, invoice):
    now = timezone.now()
    quote = quote_create(invoice=invoice, coin="LTC", now=now)
    apply(quote, [paid(quote, 40_000_000, 0)], now)
    part = alice.get(f"/pay/quote/{quote.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<section id="quote-status"') and "<html" not in part
    assert 'hx-trigger="every 5s"' in part and "0.25 LTC still due" in part
    apply(quote, [paid(quote, 25_000_000, 6), paid(quote, 40_000_000, 6, Quote.objects.get().payments.get().txid)],
          now)
    assert fresh(quote).state == Quote.State.SETTLED
    part = alice.get(f"/pay/quote/{quote.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert "hx-trigger" not in part and "hx-get" not in part and "Paid" in part
    assert f"/leases/{invoice.lease_id}/" in part


def test_late_payment_confirm_button(alice, invoice, customer):
    now = timezone.now()
    quote = quote_create(invoice=invoice, coin="LTC", now=now)
    later = quote.expires_at + timedelta(minutes=1)
    from ops.lifecycle import run_lifecycle
    run_lifecycle(later)
    sweep_expire_quotes(later)
    set_rate("LTC", "100", later)
    apply(quote, [paid(quote, DUE, 6)], later)
    page = alice.get(f"/pay/quote/{quote.pk}/").content.decode()
    assert "after this quote expired" in page and "use-late-payment" in page and "hx-trigger" not in page
    resp = alice.post(f"/pay/quote/{quote.pk}/use-late-payment/")
    new = Invoice.objects.exclude(pk=invoice.pk).get()
    assert resp.status_code == 302 and resp["Location"] == f"/leases/{new.lease_id}/"
    assert new.state == Invoice.State.PAID
