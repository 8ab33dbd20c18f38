"""Two watchers applying the same scan at the same moment, each on its own PostgreSQL
connection: one Payment row, one settlement, one ledger credit (DESIGN: one credited
payment per (coin, txid, output))."""
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Invoice, LedgerEntry, Payment, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin
from billing.payments.services import quote_create, watch_coin
from rental.models import LeaseEvent, LeaseState
from tests.billing.payments_helpers import apply, fresh, offline_adapters, paid, set_rate
from tests.billing.test_concurrency import in_threads, postgres_only
from tests.billing.test_lifecycle import order
from tests.billing.test_payments import ScriptedAdapter

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]
DUE = 65_000_000


@pytest.fixture
def placed(catalog, customer):
    now = timezone.now()
    set_rate("LTC", "100", now)
    with coins_config.use_adapters(offline_adapters()):
        lease, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="LTC", now=now)
    return lease, invoice, quote, now


def assert_credited_once(lease, invoice, quote):
    assert Payment.objects.count() == 1 and fresh(quote).state == Quote.State.SETTLED
    assert fresh(invoice).state == Invoice.State.PAID and fresh(lease).state == LeaseState.PROVISIONING
    assert LeaseEvent.objects.filter(lease=lease, kind="paid").count() == 1
    assert list(LedgerEntry.objects.values_list("kind", "amount_cents")) == [("excess_payment", 200)]


def test_two_watchers_apply_the_same_scan_at_once(placed):
    lease, invoice, quote, now = placed
    scan = [paid(quote, DUE + 2_000_000, 6)]
    with coins_config.use_adapters(offline_adapters()):
        results = in_threads(*[lambda: apply(quote, scan, now + timedelta(minutes=1)) for _ in range(4)])
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert_credited_once(lease, invoice, quote)


def test_two_watch_passes_at_once(placed):
    lease, invoice, quote, now = placed
    adapter = ScriptedAdapter([paid(quote, DUE + 2_000_000, 6)])
    with coins_config.use_adapters({Coin.LTC: adapter}):
        results = in_threads(*[lambda: watch_coin(coin="LTC", now=now + timedelta(minutes=1)) for _ in range(3)])
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert_credited_once(lease, invoice, quote)
