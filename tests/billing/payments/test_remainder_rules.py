"""The payment rules the last mutation run found untested: a reversed debt paid back
(billing.payments.reversals.debt_settle: every invoice recovered, each recovery audited with the
balance, the count it returns), the rate a quote may lock (pricing.rate_for: the refusals'
wording, the configured maximum age, the configured peg), base units and their text
(coins/amounts.py), and how a quote moves with its payments (services.quote_refresh,
_advance). Amounts are base units (litoshi) and cents."""
from datetime import timedelta
from decimal import Decimal

import pytest

from billing.models import Invoice, Payment, Quote
from billing.payments import config as coins_config
from billing.payments.coins.amounts import format_amount
from billing.payments.coins.base import Coin, DetectedPayment, ScanResult
from billing.payments.pricing import PaymentError
from billing.payments.quotes import quote_create
from billing.payments.reversals import debt_settle
from billing.payments.services import payments_apply_scan, sweep_expire_quotes
from billing.services import balance_top_up
from inventory.models import AuditEntry
from ops.lifecycle import run_lifecycle
from rental.models import LeaseEvent, LeaseState
from tests.billing.payments_helpers import (
    DUE,
    USD,
    apply,
    balance,
    fresh,
    paid,
    reverse,
    running,
    set_rate,
    txid,
)
from tests.factories import order

pytestmark = pytest.mark.django_db

PS, Q, X = Payment.State, Quote.State, Quote.Exception_


def refusal(invoice, coin, now):
    with pytest.raises(PaymentError) as refused:
        quote_create(invoice=invoice, coin=coin, now=now)
    return str(refused.value)


# --- a reversed debt paid back (debt_settle) ---------------------------------------------------

def test_paying_back_two_reversed_orders_recovers_both_audits_each_and_counts_them(
        customer, other_customer, catalog, coins, t0, settings):
    """Both LTC payments of Alice's two orders leave the chain at t0+10: she owes $130.00 and
    both leases are suspended after the 30-minute grace. A $100.00 top-up leaves $30.00 owed:
    nothing is recovered. $30.00 more brings her to exactly zero, which is enough: both invoices
    are recovered, each with an audit row saying the balance then ($0.00), both leases resume,
    and the count is 2; asked again, nothing is left to recover. Bob, whose payment was reversed
    too and who still owes, keeps his flag and his suspended lease."""
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 30
    first_lease, first, first_quote, first_p = running(customer, t0)
    second_lease, second, second_quote, second_p = running(customer, t0)
    bob_lease, bob_invoice, bob_quote, bob_p = running(other_customer, t0)
    reverse(first_quote, first_p, t0 + timedelta(minutes=10))
    reverse(second_quote, second_p, t0 + timedelta(minutes=10))
    reverse(bob_quote, bob_p, t0 + timedelta(minutes=10))
    run_lifecycle(t0 + timedelta(minutes=41))
    assert fresh(first_lease).state == fresh(second_lease).state == LeaseState.SUSPENDED
    assert balance(customer) == -13000

    balance_top_up(customer=customer, amount_cents=10000, now=t0 + timedelta(minutes=50))
    assert debt_settle(customer_id=customer.pk, now=t0 + timedelta(minutes=51)) == 0
    assert fresh(first).flag == fresh(second).flag == "payment_reversed"

    balance_top_up(customer=customer, amount_cents=3000, now=t0 + timedelta(minutes=52))
    assert debt_settle(customer_id=customer.pk, now=t0 + timedelta(minutes=53)) == 2
    assert fresh(first).flag == fresh(second).flag == "payment_recovered"
    assert fresh(first_lease).state == fresh(second_lease).state == LeaseState.ACTIVE
    audited = AuditEntry.objects.filter(action="payment_reversal_recovered").order_by("object_id")
    assert [(a.actor_id, a.object_type, a.object_id, a.detail) for a in audited] == [
        (None, "billing.Invoice", str(first.pk), {"balance": 0}),
        (None, "billing.Invoice", str(second.pk), {"balance": 0})]
    assert debt_settle(customer_id=customer.pk, now=t0 + timedelta(minutes=54)) == 0
    assert AuditEntry.objects.filter(action="payment_reversal_recovered").count() == 2
    assert LeaseEvent.objects.filter(kind="resumed", actor=None,
                                     reason="the reversed payment is paid again").count() == 2
    assert fresh(bob_invoice).flag == "payment_reversed" and fresh(bob_lease).state == LeaseState.SUSPENDED


# --- the rate a quote may lock (rate_for) ------------------------------------------------------

def test_a_coin_without_a_fresh_rate_is_refused_with_what_to_do(catalog, customer, coins, t0, settings):
    """No rate: the customer is told to pay with another coin. A rate older than the
    operator's RATE_MAX_AGE_MINUTES (5 here, not the default 15) is refused, saying when it was
    set; one exactly that old is still taken."""
    settings.RATE_MAX_AGE_MINUTES = 5
    _, invoice = order(customer, t0, pay=False)
    assert refusal(invoice, "LTC", t0) == "No LTC exchange rate is set yet; please pay with another coin."
    old = t0 - timedelta(minutes=6)
    set_rate("LTC", "100", old)
    assert refusal(invoice, "LTC", t0) == (
        f"The LTC exchange rate (set {old:%Y-%m-%d %H:%M} UTC) is out of date, so we cannot quote in LTC "
        "right now; please pay with another coin or try again later.")
    set_rate("LTC", "100", t0 - timedelta(minutes=5))
    quote = quote_create(invoice=invoice, coin="LTC", now=t0)
    assert (quote.rate_usd_per_coin, quote.rate_source, quote.rate_at) == (
        Decimal("100"), "operator", t0 - timedelta(minutes=5))


def test_a_stablecoin_quote_locks_the_configured_peg(catalog, customer, coins, t0, settings):
    """USDT pegged by the operator at $0.999: $65.00 asks 65.065066 USDT (rounded up to the
    base unit), and the quote records the peg as its rate, dated when it was made."""
    settings.USDT_PEG_USD = "0.999"
    _, invoice = order(customer, t0, pay=False)
    quote = quote_create(invoice=invoice, coin="USDT", now=t0)
    assert int(quote.amount) == 65_065_066
    assert (quote.rate_usd_per_coin, quote.rate_source, quote.rate_at) == (Decimal("0.999"), "peg", t0)
    assert quote.uri.endswith("&uint256=65065066")
    assert fresh(invoice).state == Invoice.State.OPEN and Quote.objects.count() == 1


# --- base units written out (format_amount) --------------------------------------------------

def test_an_amount_is_written_exactly_and_nothing_is_a_plain_zero():
    """What a payment URI and the API show: the exact amount in the coin's decimals, no
    trailing zeros, whatever the decimals; nothing is "0" (never "-0"); a float
    is refused, it would not be exact."""
    assert format_amount(0, 8) == format_amount(0, 0) == "0"
    assert format_amount(-1, 8) == "-0.00000001"
    assert format_amount(123, 0) == "123"
    assert format_amount(15, 1) == "1.5"
    with pytest.raises(TypeError):
        format_amount(1.5, 8)


# --- how a quote moves with its payments (quote_refresh, _advance) ----------------------------

def test_a_mined_payment_short_of_its_confirmations_is_never_timed_out(placed, t0):
    """The monitoring window (6 h from first sight) times out a payment still in the mempool;
    one mined but short of its 6 confirmations keeps counting however slow the blocks are."""
    _, _, quote = placed
    mined, waiting = paid(quote, 40 * USD, 1), paid(quote, 25 * USD, 0)
    apply(quote, [mined, waiting], t0 + timedelta(minutes=1))
    later = t0 + timedelta(minutes=2) + coins_config.monitoring_window()
    apply(quote, [mined, waiting], later)
    assert dict(Payment.objects.values_list("txid", "state")) == {mined.txid: PS.SEEN, waiting.txid: PS.INVALID}
    assert Payment.objects.get(txid=waiting.txid).invalid_reason == "unconfirmed_too_long"
    assert (int(fresh(quote).received), int(quote.confirmed)) == (40 * USD, 0)


def test_a_payment_reported_double_spent_keeps_that_reason_past_the_monitoring_window(placed, t0):
    """Why a payment did not count is what the operator reads: a double spend stays a double
    spend when the quote is looked at again hours later, not "unconfirmed too long"."""
    _, _, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=1))
    payments_apply_scan(coin="LTC", scan=ScanResult([], {}, [], [(p.txid, 0, "double_spent")]),
                        now=t0 + timedelta(minutes=2))
    assert sweep_expire_quotes(t0 + timedelta(minutes=3) + coins_config.monitoring_window()) != []
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.INVALID, "double_spent")
    assert (fresh(quote).state, quote.exception) == (Q.EXPIRED, X.NONE)


def test_the_rest_arriving_unconfirmed_makes_a_partly_paid_quote_whole_and_holds_the_order(placed, t0):
    """$40.00 confirmed, then the last $25.00 seen unconfirmed: the quote is no longer partly
    paid but waiting for confirmations, and the order is held for the monitoring window from
    the payment that completed it."""
    _, invoice, quote = placed
    apply(quote, [paid(quote, 40 * USD, 6)], t0 + timedelta(minutes=5))
    assert (fresh(quote).state, quote.exception) == (Q.PROCESSING, X.PARTIAL)
    apply(quote, [paid(quote, 25 * USD, 0)], t0 + timedelta(minutes=10))
    assert (fresh(quote).state, quote.exception, int(quote.received), int(quote.confirmed)) == (
        Q.PROCESSING, X.NONE, DUE, 40 * USD)
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=10) + coins_config.monitoring_window()


def test_the_hold_runs_from_the_payment_that_completed_the_amount_in_chain_order(placed, t0):
    """The watcher reports a $40.00 payment at t0+10, then (lagging) a $25.00 one the chain
    showed at t0+5. On the chain the $25.00 came first, so the $40.00 completed the amount:
    the order is held 6 h from t0+10, not from t0+5."""
    _, invoice, quote = placed
    apply(quote, [paid(quote, 40 * USD, 0)], t0 + timedelta(minutes=10))
    earlier = DetectedPayment(Coin.LTC, txid(), 0, quote.address, 25 * USD, 0,
                              chain_time=int((t0 + timedelta(minutes=5)).timestamp()))
    apply(quote, [earlier], t0 + timedelta(minutes=12))
    assert (fresh(quote).state, quote.exception) == (Q.PROCESSING, X.NONE)
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=10) + coins_config.monitoring_window()


def test_a_partly_paid_quote_whose_only_payment_leaves_the_chain_is_not_partly_paid_any_more(placed, t0):
    """Reorged away, the only payment no longer counts: the quote is invalid with nothing
    received, not "paid partially"."""
    _, _, quote = placed
    p = paid(quote, 30 * USD, 1)
    apply(quote, [p], t0 + timedelta(minutes=1))
    assert (fresh(quote).state, quote.exception) == (Q.PROCESSING, X.PARTIAL)
    apply(quote, [], t0 + timedelta(minutes=2), reorged=[(p.txid, 0)])
    assert (fresh(quote).state, quote.exception, int(quote.received)) == (Q.INVALID, X.NONE, 0)


def test_a_quote_past_its_expiry_whose_only_payment_was_dropped_expired_unpaid(placed, customer, t0):
    """A $30.00 payment sits in the mempool (the quote is extended to t0+31); the lagging
    watcher's next pass, at t0+40, reports it dropped: the quote expired with nothing paid,
    not "paid partially", and nothing reaches the balance."""
    _, _, quote = placed
    p = paid(quote, 30 * USD, 0)
    apply(quote, [p], t0 + timedelta(minutes=1))
    assert (fresh(quote).state, quote.exception) == (Q.PROCESSING, X.PARTIAL)
    payments_apply_scan(coin="LTC", scan=ScanResult([], {}, [], [(p.txid, 0, "evicted")]),
                        now=t0 + timedelta(minutes=40))
    assert (fresh(quote).state, quote.exception, int(quote.received)) == (Q.EXPIRED, X.NONE, 0)
    assert balance(customer) == 0


def test_a_payment_after_an_exact_settlement_is_credited_and_marks_the_quote_paid_over(placed, customer, t0):
    """Paid exactly, the quote settles with no exception; a further $2.00 sent to it later is
    credited to the balance and the quote now says "paid over"."""
    _, invoice, quote = placed
    apply(quote, [paid(quote, DUE, 6)], t0 + timedelta(minutes=5))
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.NONE)
    apply(quote, [paid(quote, 2 * USD, 6)], t0 + timedelta(minutes=9))
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.OVER)
    assert balance(customer) == 200 and fresh(invoice).state == Invoice.State.PAID
