"""The mutation run's record of the payment sweeps (ops.lifecycle.SWEEPS): the quote expiry sweep
(waits for a coin's watcher that has not scanned past the deadline; closed quotes never take
a batch's place; what it reports), the order's hold when a quote stops confirming (kept while
another quote of the order confirms, never past the latest of the order's own window — the
shorter one of a new account —, the quote's and now; other orders left alone), and the
reversed-payments sweep (a lease suspended a grace after the reversal, resumed once a top-up
pays the debt, what it reports; a suspended debtor or a customer back at zero never holds
back or takes another's suspension when the batch is full). Last, a defect: a customer back
at zero behind a full batch of other debts is never recovered."""
from datetime import timedelta

import pytest

from billing.models import Invoice, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, ScanResult
from billing.payments.quotes import quote_create
from billing.payments.services import payments_apply_scan, watch_coin
from billing.services import balance_top_up
from ops.lifecycle import run_lifecycle
from rental.events import Transition
from rental.models import LeaseEvent, LeaseState, Notification
from tests.billing.payments_helpers import (
    DUE,
    USD,
    apply,
    balance,
    fresh,
    offline_adapters,
    paid,
    place,
    reverse,
    running,
)
from tests.factories import order

pytestmark = pytest.mark.django_db

SUSPEND_REASON = "a payment for it was reversed on its chain and is not paid again"


class QuietAdapter:
    """The offline adapter (addresses only) of a coin whose node shows no payments: each
    pass reaches the chain's tip."""

    def __init__(self, coin):
        self.inner = offline_adapters()[coin]

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def scan(self, watch, cursor):
        return ScanResult([], {"height": cursor.get("height", 0) + 1}, [])

    def tip_time(self):
        return None


def of(results, sweep):
    return [t for name, t in results if name == sweep]


def dropped(coin, payment, at):
    payments_apply_scan(coin=coin, scan=ScanResult([], {}, [], dropped=[(payment.txid, 0, "evicted")]), now=at)


def suspended_text(invoice):
    return f"suspended: invoice #{invoice.pk}'s payment was reversed"


# --- the quote expiry sweep ------------------------------------------------------------------

def test_a_quote_past_its_expiry_waits_for_its_coins_watcher_and_expires_once_it_has_scanned_past(
        placed, other_customer, t0):
    """The LTC watcher last scanned at t0+1: alice's LTC quote (and her order) stay open past
    their t0+30 deadline, a payment the chain dates on time may still be found. Bob's USDT
    quote, whose watcher has scanned past the deadline, expires and is reported with its
    lease, and his order with it. Once the LTC watcher has caught up, the next pass expires
    alice's quote and order and cancels her lease."""
    lease, invoice, quote = placed
    bob_lease, bob_invoice, usdt = place(other_customer, t0, coin="USDT")
    assert quote.expires_at == usdt.expires_at == fresh(invoice).expires_at == t0 + timedelta(minutes=30)
    with coins_config.use_adapters({Coin.LTC: QuietAdapter(Coin.LTC), Coin.USDT: QuietAdapter(Coin.USDT)}):
        watch_coin(coin="LTC", now=t0 + timedelta(minutes=1))
        watch_coin(coin="USDT", now=t0 + timedelta(minutes=1))
        watch_coin(coin="USDT", now=t0 + timedelta(minutes=40))
        results = run_lifecycle(t0 + timedelta(minutes=41))
        assert of(results, "expire_quotes") == [Transition(bob_lease.pk, f"quote #{usdt.pk} expired")]
        assert (fresh(usdt).state, fresh(bob_invoice).state, fresh(bob_lease).state) == (
            Quote.State.EXPIRED, Invoice.State.EXPIRED, LeaseState.CANCELLED)
        assert (fresh(quote).state, fresh(invoice).state, fresh(lease).state) == (
            Quote.State.NEW, Invoice.State.OPEN, LeaseState.PENDING)

        watch_coin(coin="LTC", now=t0 + timedelta(minutes=45))
        results = run_lifecycle(t0 + timedelta(minutes=46))
    assert of(results, "expire_quotes") == [Transition(lease.pk, f"quote #{quote.pk} expired")]
    assert (fresh(quote).state, fresh(invoice).state, fresh(lease).state) == (
        Quote.State.EXPIRED, Invoice.State.EXPIRED, LeaseState.CANCELLED)


def test_quotes_closed_long_ago_never_hold_back_the_expiry_of_a_due_quote(
        customer, other_customer, catalog, coins, t0, settings):
    """Bob's quote settled; its expiry passed first. With batches of one, the pass still
    expires alice's unpaid quote when its time comes: a closed quote is not due."""
    settings.LIFECYCLE_BATCH = 1
    _, bob_invoice, bob_quote = place(other_customer, t0)
    apply(bob_quote, [paid(bob_quote, DUE, 6)], t0 + timedelta(minutes=2))
    assert fresh(bob_quote).state == Quote.State.SETTLED and fresh(bob_invoice).state == Invoice.State.PAID
    lease, invoice, quote = place(customer, t0 + timedelta(minutes=5))
    assert quote.expires_at == t0 + timedelta(minutes=35)

    results = run_lifecycle(t0 + timedelta(minutes=36))
    assert of(results, "expire_quotes") == [Transition(lease.pk, f"quote #{quote.pk} expired")]
    assert fresh(quote).state == Quote.State.EXPIRED and fresh(bob_quote).state == Quote.State.SETTLED
    assert fresh(invoice).state == Invoice.State.EXPIRED and fresh(lease).state == LeaseState.CANCELLED


# --- the order's hold when a quote stops confirming -----------------------------------------

def test_an_order_stays_held_while_another_of_its_quotes_is_confirming(placed, t0):
    """Alice sent the whole amount in LTC (unconfirmed): her order is held for the
    monitoring window from that payment. A USDT transfer to her other quote comes and goes;
    the order stays held for the LTC payment, which then confirms and pays it."""
    lease, invoice, a = placed
    b = quote_create(invoice=invoice, coin="USDT", now=t0)
    whole = paid(a, DUE, 0)
    apply(a, [whole], t0 + timedelta(minutes=5))
    held = t0 + timedelta(minutes=5) + coins_config.monitoring_window()
    assert fresh(a).state == Quote.State.PROCESSING and fresh(invoice).expires_at == held
    dust = paid(b, 1, 0)
    apply(b, [dust], t0 + timedelta(minutes=6))
    dropped("USDT", dust, t0 + timedelta(minutes=7))
    assert fresh(b).state == Quote.State.INVALID
    assert fresh(invoice).expires_at == held

    run_lifecycle(t0 + timedelta(minutes=31))
    assert fresh(invoice).state == Invoice.State.OPEN and fresh(lease).state == LeaseState.PENDING
    apply(a, [paid(a, DUE, 6, whole.txid)], t0 + timedelta(minutes=40))
    assert fresh(a).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID


def test_a_payment_leaving_the_mempool_releases_its_own_order_only(placed, other_customer, t0):
    """Alice and Bob each sent the whole amount in LTC, unconfirmed: both orders are held.
    Alice's payment leaves the mempool: her order falls back to its own window (her unused
    USDT quote does not hold it), and expires when that ends; Bob's order is still held for
    his payment."""
    lease, invoice, a = placed
    quote_create(invoice=invoice, coin="USDT", now=t0)
    bob_lease, bob_invoice, c = place(other_customer, t0)
    hers, his = paid(a, DUE, 0), paid(c, DUE, 0)
    apply(a, [hers, his], t0 + timedelta(minutes=5))
    held = t0 + timedelta(minutes=5) + coins_config.monitoring_window()
    assert fresh(invoice).expires_at == fresh(bob_invoice).expires_at == held

    dropped("LTC", hers, t0 + timedelta(minutes=8))
    assert fresh(a).state == Quote.State.INVALID and fresh(c).state == Quote.State.PROCESSING
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=30)
    assert fresh(bob_invoice).expires_at == held

    run_lifecycle(t0 + timedelta(minutes=31))
    assert fresh(invoice).state == Invoice.State.EXPIRED and fresh(lease).state == LeaseState.CANCELLED
    assert fresh(bob_invoice).state == Invoice.State.OPEN and fresh(bob_lease).state == LeaseState.PENDING


def test_a_partly_paid_quote_whose_payment_leaves_the_mempool_keeps_the_order_until_the_quote_ends(placed, t0):
    """$30 at t0+5 keeps the quote (and the order) open until t0+35. The payment leaves the
    mempool: the quote can still be paid until t0+35, so the order is held as long — not
    cut back to its own t0+30."""
    lease, invoice, a = placed
    part = paid(a, 30 * USD, 0)
    apply(a, [part], t0 + timedelta(minutes=5))
    extended = t0 + timedelta(minutes=35)
    assert fresh(a).expires_at == fresh(invoice).expires_at == extended
    dropped("LTC", part, t0 + timedelta(minutes=8))
    assert fresh(a).state == Quote.State.INVALID
    assert fresh(invoice).expires_at == extended
    run_lifecycle(t0 + timedelta(minutes=31))
    assert fresh(invoice).state == Invoice.State.OPEN and fresh(lease).state == LeaseState.PENDING


def test_a_new_accounts_order_falls_back_to_its_shorter_window_when_its_payment_leaves_the_mempool(
        customer, catalog, coins, t0, settings):
    """A new account's order holds its GPUs 15 minutes, not the standard 30. The whole
    amount arrives unconfirmed (held for the monitoring window), then leaves the mempool:
    the order falls back to its own 15 minutes and expires then."""
    settings.PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES = 15
    lease, invoice, a = place(customer, t0)
    assert fresh(lease).pay_by == fresh(invoice).expires_at == a.expires_at == t0 + timedelta(minutes=15)
    whole = paid(a, DUE, 0)
    apply(a, [whole], t0 + timedelta(minutes=5))
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=5) + coins_config.monitoring_window()
    dropped("LTC", whole, t0 + timedelta(minutes=8))
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=15)
    run_lifecycle(t0 + timedelta(minutes=16))
    assert fresh(invoice).state == Invoice.State.EXPIRED and fresh(lease).state == LeaseState.CANCELLED


# --- the reversed-payments sweep -------------------------------------------------------------

def test_a_reversed_payment_suspends_the_lease_after_the_grace_and_a_top_up_resumes_it(
        customer, catalog, coins, t0, settings):
    """Alice rented before (an order paid from her balance). The LTC payment that paid her
    new order leaves the chain at t0+10: $65.00 is owed. The lease runs through the
    60-minute grace, then the pass suspends it and reports it. Alice tops up $65.00: the
    next pass clears the reversed invoice, resumes the lease and reports her debt paid."""
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 60
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    _, earlier = order(customer, t0)
    assert fresh(earlier).state == Invoice.State.PAID and balance(customer) == 0
    lease, invoice, quote, p = running(customer, t0)
    reverse(quote, p, t0 + timedelta(minutes=10))
    assert balance(customer) == -6500 and fresh(invoice).flag == "payment_reversed"

    assert of(run_lifecycle(t0 + timedelta(minutes=69)), "reversed_payments") == []
    assert fresh(lease).state == LeaseState.ACTIVE
    results = run_lifecycle(t0 + timedelta(minutes=71))
    assert of(results, "reversed_payments") == [Transition(lease.pk, suspended_text(invoice))]
    assert fresh(lease).state == LeaseState.SUSPENDED
    assert LeaseEvent.objects.filter(lease=lease, kind="suspended").get().reason == SUSPEND_REASON
    notice = Notification.objects.get(lease=lease, kind="suspended")  # the payment, not the term
    assert "left its chain after it counted" in notice.body and "Topping up your balance" in notice.body
    assert "ended unpaid" not in notice.body and "renewal invoice" not in notice.body

    balance_top_up(customer=customer, amount_cents=6500, now=t0 + timedelta(minutes=80))
    assert balance(customer) == 0
    results = run_lifecycle(t0 + timedelta(minutes=81))
    assert of(results, "reversed_payments") == [
        Transition(None, f"reversed payments of customer #{customer.pk} paid again")]
    assert fresh(invoice).flag == "payment_recovered" and fresh(lease).state == LeaseState.ACTIVE
    assert LeaseEvent.objects.filter(lease=lease, kind="resumed").get().reason == "the reversed payment is paid again"


def test_a_debtors_lease_already_suspended_does_not_hold_back_the_suspension_of_the_next(
        customer, other_customer, catalog, coins, t0, settings):
    """Batches of one. Alice's payment is reversed at t0+10, Bob's at t0+20 (grace 30
    minutes). Alice's lease is suspended at t0+45; at t0+55 Bob's is, though Alice still owes
    and her reversed invoice comes first."""
    settings.LIFECYCLE_BATCH = 1
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 30
    lease, invoice, quote, p = running(customer, t0)
    bob_lease, bob_invoice, bob_quote, bob_p = running(other_customer, t0)
    reverse(quote, p, t0 + timedelta(minutes=10))
    reverse(bob_quote, bob_p, t0 + timedelta(minutes=20))

    results = run_lifecycle(t0 + timedelta(minutes=45))
    assert of(results, "reversed_payments") == [Transition(lease.pk, suspended_text(invoice))]
    assert (fresh(lease).state, fresh(bob_lease).state) == (LeaseState.SUSPENDED, LeaseState.ACTIVE)

    results = run_lifecycle(t0 + timedelta(minutes=55))
    assert of(results, "reversed_payments") == [Transition(bob_lease.pk, suspended_text(bob_invoice))]
    assert fresh(bob_lease).state == LeaseState.SUSPENDED and balance(customer) == balance(other_customer) == -6500


def owing_first_and_paid_back(customer, other_customer, t0):
    """Alice's order comes first; Bob's payment is reversed at t0+10 and he tops up what he
    owes at t0+20; Alice's is reversed at t0+50 and she still owes it."""
    lease, invoice, quote, p = running(customer, t0)
    bob_lease, bob_invoice, bob_quote, bob_p = running(other_customer, t0)
    assert invoice.pk < bob_invoice.pk
    reverse(bob_quote, bob_p, t0 + timedelta(minutes=10))
    balance_top_up(customer=other_customer, amount_cents=6500, now=t0 + timedelta(minutes=20))
    reverse(quote, p, t0 + timedelta(minutes=50))
    assert (balance(customer), balance(other_customer)) == (-6500, 0)
    return lease, bob_lease, bob_invoice


def test_a_customer_back_at_zero_is_never_suspended_for_a_reversed_payment(
        customer, other_customer, catalog, coins, t0, settings):
    """Batches of one, grace 30 minutes. At t0+60 Bob's reversal is past the grace, but his
    balance is back at zero: his lease keeps running and his invoice is recovered, though
    Alice's older debt is ahead of his in the batch. Alice is still within her grace."""
    settings.LIFECYCLE_BATCH = 1
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 30
    lease, bob_lease, bob_invoice = owing_first_and_paid_back(customer, other_customer, t0)
    results = run_lifecycle(t0 + timedelta(minutes=60))
    assert [t.what for t in of(results, "reversed_payments")] == [
        f"reversed payments of customer #{other_customer.pk} paid again"]
    assert fresh(bob_invoice).flag == "payment_recovered"
    assert (fresh(lease).state, fresh(bob_lease).state) == (LeaseState.ACTIVE, LeaseState.ACTIVE)
    assert not LeaseEvent.objects.filter(kind="suspended").exists()


def test_a_customer_who_paid_back_is_recovered_even_behind_a_full_batch_of_other_debts(
        customer, other_customer, catalog, coins, t0, settings):
    """Batches of one (as a pass with LIFECYCLE_BATCH debtors ahead). Bob's lease was
    suspended for his reversed payment; Alice's older order is reversed too, and she still
    owes. Bob tops up what he owes: his invoice is recovered and his lease resumes
    (reversals: "once the balance is back at zero or above the flag becomes
    payment_recovered and the lease resumes")."""
    settings.LIFECYCLE_BATCH = 1
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 30
    _, _, quote, p = running(customer, t0)
    bob_lease, bob_invoice, bob_quote, bob_p = running(other_customer, t0)
    reverse(bob_quote, bob_p, t0 + timedelta(minutes=10))
    run_lifecycle(t0 + timedelta(minutes=41))
    assert fresh(bob_lease).state == LeaseState.SUSPENDED
    reverse(quote, p, t0 + timedelta(minutes=45))
    balance_top_up(customer=other_customer, amount_cents=6500, now=t0 + timedelta(minutes=50))
    run_lifecycle(t0 + timedelta(minutes=51))
    run_lifecycle(t0 + timedelta(minutes=52))
    assert fresh(bob_invoice).flag == "payment_recovered" and fresh(bob_lease).state == LeaseState.ACTIVE
