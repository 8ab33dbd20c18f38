"""Two watchers applying the same scan at the same moment, each on its own PostgreSQL
connection: one Payment row, one settlement, one ledger credit (DESIGN: one credited
payment per (coin, txid, output)). For one quote the quote's row lock serialises them; for
one payment reported under two quotes (a Solana transfer with two references) only the
unique constraint does, and the race is made to reach it."""
import threading
from datetime import timedelta

import pytest
from django.db.models.signals import post_save, pre_save
from django.utils import timezone

from billing.models import Invoice, LedgerEntry, Payment, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, DetectedPayment, ScanResult
from billing.payments.coins.solana import SolanaAdapter
from billing.payments.services import payments_apply_scan, quote_create, watch_coin
from rental.models import LeaseEvent, LeaseState
from tests.billing.payments_helpers import (
    ScriptedAdapter,
    apply,
    fresh,
    offline_adapters,
    paid,
    set_rate,
)
from tests.billing.races import in_threads, postgres_only
from tests.factories import order

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


MERCHANT = "9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM"


@pytest.fixture
def two_sol_quotes(catalog, customer):
    """Two unpaid orders of one customer, each with its Solana Pay quote (0.5 SOL each)."""
    now = timezone.now()
    set_rate("SOL", "130", now)
    with coins_config.use_adapters({Coin.SOL: SolanaAdapter(MERCHANT)}):
        quotes = [quote_create(invoice=order(customer, now, pay=False)[1], coin="SOL", now=now) for _ in range(2)]
    return quotes, now


@pytest.fixture
def inserts():
    """Every attempt to insert a Payment row, and those that landed. Both attempts wait for
    each other, so both watchers have looked for the row and missed it before either inserts."""
    attempted, landed = [], []
    both_missed = threading.Barrier(2, timeout=20)

    def before_insert(sender, instance, raw, **kwargs):
        if instance.pk is None:
            attempted.append(instance.quote_id)
            both_missed.wait()

    def after_insert(sender, instance, created, **kwargs):
        if created:
            landed.append(instance.quote_id)

    pre_save.connect(before_insert, sender=Payment)
    post_save.connect(after_insert, sender=Payment)
    yield attempted, landed
    pre_save.disconnect(before_insert, sender=Payment)
    post_save.disconnect(after_insert, sender=Payment)


def test_one_transfer_two_references_two_watchers_credit_it_once(two_sol_quotes, inserts):
    """A Solana transfer may carry several references; each watcher process reports it under
    the first one it looks up (its watch set's order differs between processes), so two
    watchers lock two different quotes, both miss the Payment row, and both insert. The
    (coin, txid, output) constraint refuses one: that watcher reads the row instead and
    returns normally; the transfer pays one invoice, once."""
    (first, second), now = two_sol_quotes
    signature = "5" * 88
    attempted, landed = inserts
    seen_as = [DetectedPayment(Coin.SOL, signature, 0, q.reference, first.amount, 1, None, 100)
               for q in (first, second)]
    later = now + timedelta(minutes=1)

    with coins_config.use_adapters({Coin.SOL: SolanaAdapter(MERCHANT)}):
        results = in_threads(*[lambda p=p: payments_apply_scan(coin="SOL", scan=ScanResult([p], {}, []), now=later)
                               for p in seen_as])

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(attempted) == sorted([first.pk, second.pk]) and len(landed) == 1  # the constraint refused one
    payment = Payment.objects.get()
    paid_quote, other = (first, second) if payment.quote_id == first.pk else (second, first)
    assert landed == [paid_quote.pk]
    assert fresh(paid_quote).state == Quote.State.SETTLED and fresh(paid_quote.invoice).state == Invoice.State.PAID
    assert fresh(other).state == Quote.State.NEW and fresh(other).received == 0
    assert fresh(other.invoice).state == Invoice.State.OPEN
    assert not LedgerEntry.objects.exists()  # exactly the amount: no excess, no second credit
