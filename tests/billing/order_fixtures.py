"""The order fixtures of the money tests: the time, offline coins, and an unpaid order with its
LTC quote, with the standard payment window for new accounts. Registered by tests/billing's
conftest.py and by tests/ops/lifecycle's (the lifecycle pass's tests order and pay the same
way)."""
import pytest
from django.utils import timezone

from billing.payments.services import quote_create
from tests.billing.payments_helpers import offline_coins, set_rate
from tests.factories import order


@pytest.fixture(autouse=True)
def full_window_for_new_accounts(settings):
    """Billing tests are about the standard payment window, with brand-new customers; the
    shorter hold for accounts that never paid has its own tests in
    tests/security/test_hoarding.py."""
    settings.PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES = settings.PAYMENT_WINDOW_MINUTES


@pytest.fixture
def t0():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def coins(db):
    with offline_coins():
        yield


@pytest.fixture
def placed(catalog, customer, coins, t0):
    """An unpaid order (rtx-3090, one week: $65) and its LTC quote at $100/LTC."""
    set_rate("LTC", "100", t0)
    lease, invoice = order(customer, t0, pay=False)
    return lease, invoice, quote_create(invoice=invoice, coin="LTC", now=t0)
