"""`make run` must give a complete path: with DEMO_PAYMENTS on, a customer settles their
own invoice with a clearly marked "simulate payment" button; off (production) there is no
such button, the service refuses, `check --deploy` refuses the setting, and a store with
no coin configured shows no crypto pay button and alerts operators."""
import pytest
from django.core import checks
from django.urls import reverse

from billing.models import Invoice
from billing.payments.config import use_adapters
from ops.backoffice.dashboard import dashboard
from rental.models import LeaseState
from tests.factories import place


@pytest.fixture
def alice(client, customer):
    client.force_login(customer)
    return client


def _open_invoice(customer):
    lease, invoice = place(customer)
    assert invoice.state == Invoice.State.OPEN
    return lease, invoice


def test_demo_mode_settles_the_customers_invoice_and_says_it_is_a_demo(alice, catalog, customer, settings):
    settings.DEMO_PAYMENTS = True
    lease, invoice = _open_invoice(customer)
    page = alice.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
    assert "Simulate payment (demo)" in page and "Demo store: payments are simulated" in page
    alice.post(reverse("billing:invoice_pay_demo", args=[invoice.pk]))
    invoice.refresh_from_db()
    lease.refresh_from_db()
    assert invoice.state == Invoice.State.PAID and invoice.paid_via == "demo"
    assert lease.state == LeaseState.PROVISIONING


def test_demo_payment_of_another_customers_invoice_is_404(client, catalog, customer, other_customer, settings):
    settings.DEMO_PAYMENTS = True
    _lease, invoice = _open_invoice(customer)
    client.force_login(other_customer)
    assert client.post(reverse("billing:invoice_pay_demo", args=[invoice.pk])).status_code == 404
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.OPEN


def test_without_demo_mode_there_is_no_button_and_the_service_refuses(alice, catalog, customer, settings):
    settings.DEMO_PAYMENTS = False
    _lease, invoice = _open_invoice(customer)
    page = alice.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
    assert "Simulate payment" not in page and "Demo store" not in page
    alice.post(reverse("billing:invoice_pay_demo", args=[invoice.pk]))
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.OPEN


def test_no_coin_configured_means_no_crypto_button_and_an_operator_alert(alice, catalog, customer, settings):
    settings.DEMO_PAYMENTS = False
    _lease, invoice = _open_invoice(customer)
    with use_adapters({}):
        page = alice.get(reverse("billing:invoice", args=[invoice.pk])).content.decode()
        alerts = dashboard(invoice.created_at).alerts
    assert "accepts no cryptocurrency" in page and reverse("payments:invoice", args=[invoice.pk]) not in page
    assert any("No coin is configured" in a for a in alerts)


def test_check_deploy_refuses_demo_payments(settings):
    settings.DEMO_PAYMENTS = True
    ids = {m.id for m in checks.run_checks(include_deployment_checks=True)}
    assert "billing.E001" in ids
    settings.DEMO_PAYMENTS = False
    assert "billing.E001" not in {m.id for m in checks.run_checks(include_deployment_checks=True)}


def test_check_deploy_refuses_simulated_storage(settings):
    settings.DEMO_PAYMENTS = False
    settings.STORAGE_SIMULATED = True
    assert "billing.E002" in {m.id for m in checks.run_checks(include_deployment_checks=True)}
    settings.STORAGE_SIMULATED = False
    assert "billing.E002" not in {m.id for m in checks.run_checks(include_deployment_checks=True)}
