"""The demo store's checkout is the real one: with DEMO_PAYMENTS on, an invoice
offers the DEMO coin; its quote page has an amount, an address and a QR code marked as demo;
the demo wallet's payment goes onto the demo chain and the watcher credits it through the
same payment services as any coin. With demo mode off the coin does not exist for customers."""
import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice, Payment, Quote
from billing.payments.demo import demo_coin_send
from billing.payments.services import PaymentError, coins_offered, quote_create, watch_coin
from billing.services import BillingError
from rental.models import LeaseState
from tests.factories import place


@pytest.fixture
def alice(client, customer):
    client.force_login(customer)
    return client


def test_demo_checkout_shows_a_marked_demo_address_and_the_watcher_credits_the_payment(alice, catalog, customer,
                                                                                       settings):
    settings.DEMO_PAYMENTS = True
    lease, invoice = place(customer)
    page = alice.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
    assert "Pay with DEMO" in page
    picker = alice.get(reverse("payments:invoice", args=[invoice.pk])).content.decode()
    assert "Demo coin (no value)" in picker
    response = alice.post(reverse("payments:invoice", args=[invoice.pk]), {"coin": "DEMO"})
    quote = Quote.objects.get(invoice=invoice)
    assert response["Location"] == reverse("payments:quote", args=[quote.pk])
    assert quote.coin == "DEMO" and quote.address.startswith("DEMO-NOT-A-REAL-ADDRESS-")
    assert quote.amount == invoice.amount_cents * 10**4  # pegged 1 DEMO = 1 USD, 6 decimals
    page = alice.get(reverse("payments:quote", args=[quote.pk])).content.decode()
    assert "DEMO — not a real address" in page and "<svg" in page and quote.address in page
    assert "Send " in page and " DEMO from the demo wallet" in page

    alice.post(reverse("payments:demo_wallet", args=[quote.pk]))
    quote.refresh_from_db()
    invoice.refresh_from_db()
    lease.refresh_from_db()
    assert quote.state == Quote.State.SETTLED
    assert invoice.state == Invoice.State.PAID and invoice.paid_via == "DEMO"
    assert lease.state == LeaseState.PROVISIONING
    payment = Payment.objects.get(quote=quote)
    assert payment.amount == quote.amount and payment.coin == "DEMO"
    # The beat's next watcher pass sees the same transaction again: credited once.
    watch_coin(coin="DEMO")
    assert Payment.objects.filter(quote=quote).count() == 1
    page = alice.get(reverse("payments:quote", args=[quote.pk])).content.decode()
    assert "Paid. Thank you!" in page and "from the demo wallet" not in page  # nothing left to send


def test_the_demo_wallet_pays_only_the_customers_own_open_demo_quote(catalog, customer, other_customer, settings):
    settings.DEMO_PAYMENTS = True
    _lease, invoice = place(customer)
    quote = quote_create(invoice=invoice, coin="DEMO", now=timezone.now())
    with pytest.raises(BillingError):
        demo_coin_send(quote=quote, actor=other_customer, now=timezone.now())
    assert not Payment.objects.exists()


def test_without_demo_mode_there_is_no_demo_coin(catalog, customer, settings):
    settings.DEMO_PAYMENTS = False
    _lease, invoice = place(customer)
    assert "DEMO" not in coins_offered()
    with pytest.raises(PaymentError):
        quote_create(invoice=invoice, coin="DEMO", now=timezone.now())
