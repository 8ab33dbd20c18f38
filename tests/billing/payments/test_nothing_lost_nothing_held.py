"""Payments never lose money nor hold stock for a payment that will not come, through the services (the chain side is in test_on_real_chains.py on a real
litecoind): late and extra money at the rate when it confirmed, capped per quote, else held
for an operator; unconfirmed payments invalid after the monitoring window or when the node
drops them, the hold released, dust never extending it; chain time; a coin whose node fails
or lags is not offered; a reversal after settlement claws back unspent credit; the speed
policy by amount."""
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Invoice, LedgerEntry, Payment, PaymentReview, Quote, WatcherCursor
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, ScanResult
from billing.payments.credits import payment_review_close, payment_review_credit
from billing.payments.pricing import PaymentError
from billing.payments.services import (
    coins_offered,
    payments_apply_scan,
    quote_create,
    sweep_expire_quotes,
    watch_coin,
)
from billing.services import balance_top_up, invoice_pay_from_balance, ledger_post
from inventory.models import AuditEntry
from ops.backoffice.dashboard import dashboard
from ops.lifecycle import run_lifecycle
from rental.models import LeaseState
from tests.billing.payments_helpers import (
    DUE,
    USD,
    apply,
    balance,
    credits,
    fresh,
    offline_adapters,
    paid,
    set_rate,
)
from tests.factories import order

Q, X, PS, R = Quote.State, Quote.Exception_, Payment.State, PaymentReview


def expire(quote, at):
    run_lifecycle(at)
    sweep_expire_quotes(at)
    return fresh(quote)


# --- 1. late and extra money -----------------------------------------------------------------

def test_late_payment_is_credited_at_the_rate_when_it_confirms(placed, customer, t0):
    _, _, quote = placed  # locked at $100/LTC
    later = t0 + timedelta(days=6)
    assert expire(quote, t0 + timedelta(minutes=31)).state == Q.EXPIRED
    set_rate("LTC", "50", later)  # the coin halved since
    apply(quote, [paid(quote, DUE, 6)], later)
    assert credits(LedgerEntry.Kind.LATE_PAYMENT) == [3250] and balance(customer) == 3250  # not $65
    p = Payment.objects.get()
    assert (p.credited_cents, str(p.credit_rate)) == (3250, "50.00000000")
    apply(quote, [paid(quote, DUE, 7, p.txid)], later + timedelta(minutes=1))
    assert balance(customer) == 3250


def test_payment_after_settlement_uses_the_rate_when_it_confirms(placed, customer, t0):
    _, _, quote = placed
    apply(quote, [paid(quote, DUE, 6)], t0 + timedelta(minutes=5))
    set_rate("LTC", "200", t0 + timedelta(hours=2))
    apply(quote, [paid(quote, 10 * USD, 6)], t0 + timedelta(hours=2))
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.OVER)
    assert credits(LedgerEntry.Kind.EXCESS_PAYMENT) == [2000] and balance(customer) == 2000


def test_a_payment_sent_the_second_the_quote_settled_keeps_the_quoted_rate(placed, customer, t0):
    """The locked rate covers payments first seen up to and including the settlement's moment
    (the same "by" as on time up to the expiry); only a later one takes the rate when it confirms."""
    _, _, quote = placed
    settled = t0 + timedelta(minutes=5)
    apply(quote, [paid(quote, DUE, 6)], settled)
    set_rate("LTC", "200", t0 + timedelta(hours=2))
    extra = replace(paid(quote, 10 * USD, 6), chain_time=int(settled.timestamp()))
    apply(quote, [extra], t0 + timedelta(hours=2))
    assert credits(LedgerEntry.Kind.EXCESS_PAYMENT) == [1000] and balance(customer) == 1000  # $10 at $100/LTC


def test_the_credit_of_an_extra_payment_says_which_payment_and_which_rate(placed, t0):
    """The ledger line an operator reads for an extra payment names the transaction output
    (its first 16 hex digits and output index) and the rate it was credited at: the quote's
    locked rate ("quoted") for one sent by the settlement, the rate when it confirmed for a
    later one."""
    _, _, quote = placed  # locked at $100/LTC
    settled = t0 + timedelta(minutes=5)
    apply(quote, [paid(quote, DUE, 6)], settled)
    later = t0 + timedelta(hours=2)
    set_rate("LTC", "200", later)
    by_settlement = replace(paid(quote, 10 * USD, 6, "ab" * 32, n=1), chain_time=int(settled.timestamp()))
    after_it = paid(quote, 10 * USD, 6, "cd" * 32, n=3)
    apply(quote, [by_settlement, after_it], later)
    entries = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.EXCESS_PAYMENT)
    assert {e.invoice_id for e in entries} == {quote.invoice_id}  # each line points at the invoice paid
    memos = sorted(e.memo for e in entries)
    assert memos == [f"LTC abababababababab…:1 to quote #{quote.pk} at $100/LTC (quoted)",
                     f"LTC cdcdcdcdcdcdcdcd…:3 to quote #{quote.pk} at $200/LTC (when confirmed)"]


def test_late_payment_without_a_fresh_rate_waits_for_an_operator(placed, customer, operator, t0):
    _, _, quote = placed
    later = t0 + timedelta(hours=3)  # the $100 rate is 3 h old: stale
    expire(quote, t0 + timedelta(minutes=31))
    apply(quote, [paid(quote, DUE, 6)], later)
    review = PaymentReview.objects.get()
    assert (review.kind, review.state, review.proposed_cents) == (R.Kind.NO_RATE, R.State.OPEN, None)
    assert balance(customer) == 0 and Payment.objects.get().credited_cents is None
    apply(quote, [paid(quote, DUE, 7, Payment.objects.get().txid)], later)  # next pass: still one review
    assert PaymentReview.objects.count() == 1

    with pytest.raises(PaymentError, match="out of date"):
        payment_review_credit(review=review, actor=operator, now=later)
    set_rate("LTC", "80", later)
    payment_review_credit(review=review, actor=operator, now=later)
    assert balance(customer) == 5200 and fresh(review).state == R.State.CREDITED
    assert Payment.objects.get().credited_cents == 5200
    with pytest.raises(PaymentError, match="already decided"):
        payment_review_credit(review=review, actor=operator, now=later)
    assert AuditEntry.objects.filter(action="payment_review_credited", actor=operator).count() == 1


def test_a_quote_credits_up_to_its_cap_automatically_the_rest_waits(placed, customer, operator, t0, settings):
    """The issue's case: rate halved days later, a thousand times the amount sent."""
    settings.PAYMENT_AUTO_CREDIT_MAX_PERCENT = 150
    _, _, quote = placed
    later = t0 + timedelta(days=6)
    expire(quote, t0 + timedelta(minutes=31))
    set_rate("LTC", "50", later)
    apply(quote, [paid(quote, DUE, 6)], later)  # $32.50: within 150 % of $65
    apply(quote, [paid(quote, 1000 * DUE, 6)], later)  # $32,500: held
    assert balance(customer) == 3250
    review = PaymentReview.objects.get()
    assert (review.kind, review.proposed_cents, int(review.amount)) == (R.Kind.OVER_CAP, 3_250_000, 1000 * DUE)
    assert Payment.objects.get(amount=1000 * DUE).credited_cents is None  # held, not credited
    payment_review_close(review=review, actor=operator, now=later, note="refunded on-chain, tx abc")
    assert balance(customer) == 3250 and fresh(review).state == R.State.CLOSED
    with pytest.raises(PaymentError):
        payment_review_close(review=review, actor=operator, now=later, note="again")


def test_overpayment_at_settlement_past_the_cap_is_held(placed, customer, t0, settings):
    settings.PAYMENT_AUTO_CREDIT_MAX_PERCENT = 10  # $6.50
    _, invoice, quote = placed
    apply(quote, [paid(quote, DUE + 7 * USD, 6)], t0 + timedelta(minutes=3))
    assert fresh(invoice).state == Invoice.State.PAID and balance(customer) == 0
    review = PaymentReview.objects.get()
    assert (review.kind, review.payment, review.proposed_cents) == (R.Kind.OVER_CAP, None, 700)


def test_customer_sees_what_each_payment_did(placed, customer, client, t0):
    _, _, quote = placed
    expire(quote, t0 + timedelta(minutes=31))
    set_rate("LTC", "50", t0 + timedelta(hours=1))
    apply(quote, [paid(quote, 40 * USD, 6)], t0 + timedelta(hours=1))
    apply(quote, [paid(quote, 1000 * DUE, 6)], t0 + timedelta(hours=1))  # past the cap: held
    client.force_login(customer)
    page = client.get(f"/pay/quote/{quote.pk}/").content.decode()
    assert "$20.00" in page and "$50 per LTC when it confirmed" in page
    assert "held for review by our staff" in page


# --- 2. monitoring window, drops, dust ---------------------------------------------------------

def test_unconfirmed_payment_past_the_monitoring_window_is_invalid_and_releases_the_slots(placed, t0, settings):
    settings.PAYMENT_MONITORING_MINUTES = 120
    lease, invoice, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=10))
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=130)  # held while it confirms
    run_lifecycle(t0 + timedelta(minutes=60))
    assert fresh(lease).state == LeaseState.PENDING
    assert sweep_expire_quotes(t0 + timedelta(minutes=131)) != []  # the sweep judges it
    assert (fresh(quote).state, Payment.objects.get().state) == (Q.EXPIRED, PS.INVALID)
    assert fresh(invoice).expires_at <= t0 + timedelta(minutes=131)  # not extended by it any more
    run_lifecycle(t0 + timedelta(minutes=131))
    assert fresh(lease).state == LeaseState.CANCELLED and fresh(invoice).state == Invoice.State.EXPIRED
    apply(quote, [p], t0 + timedelta(minutes=140))  # still in some mempool: stays invalid
    assert Payment.objects.get().state == PS.INVALID


def test_the_hold_runs_from_the_payment_that_completed_the_amount(placed, t0, settings):
    """Paid in two parts, both waiting for confirmations: the slots are held for the monitoring
    window from the payment that brought in the last base unit, not from the first part (one
    unit short) nor from dust that came after it."""
    settings.PAYMENT_MONITORING_MINUTES = 120
    settings.UNDERPAYMENT_TOLERANCE_BPS = 0
    _, invoice, quote = placed
    apply(quote, [paid(quote, DUE - 1, 0)], t0 + timedelta(minutes=5))
    apply(quote, [paid(quote, 1, 0)], t0 + timedelta(minutes=10))
    assert fresh(quote).state == Q.PROCESSING
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=10 + 120)
    apply(quote, [paid(quote, DUE // 200, 0)], t0 + timedelta(minutes=20))
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=10 + 120)


def test_dropped_payment_is_invalid_and_the_hold_is_released(placed, t0):
    lease, invoice, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=29))
    assert fresh(invoice).expires_at > t0 + timedelta(hours=5)
    scan = ScanResult([], {}, [], [(p.txid, 0, "double_spent")])
    payments_apply_scan(coin="LTC", scan=scan, now=t0 + timedelta(minutes=40))
    row = Payment.objects.get()
    assert (row.state, row.invalid_reason) == (PS.INVALID, "double_spent")
    assert fresh(quote).state == Q.EXPIRED and fresh(invoice).expires_at == t0 + timedelta(minutes=40)
    run_lifecycle(t0 + timedelta(minutes=40))
    assert fresh(lease).state == LeaseState.CANCELLED


def test_dropped_payment_that_comes_back_counts_again(placed, t0):
    _, invoice, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=1))
    payments_apply_scan(coin="LTC", scan=ScanResult([], {}, [], [(p.txid, 0, "evicted")]),
                        now=t0 + timedelta(minutes=2))
    assert fresh(quote).state == Q.INVALID
    apply(quote, [replace(p, confirmations=6)], t0 + timedelta(minutes=3))  # rebroadcast and mined
    assert fresh(quote).state == Q.SETTLED and fresh(invoice).state == Invoice.State.PAID


def test_dust_never_extends_a_hold(placed, t0):
    _, invoice, quote = placed
    apply(quote, [paid(quote, DUE // 200, 0)], t0 + timedelta(minutes=29))  # 0.5 %: dust
    assert fresh(quote).expires_at == t0 + timedelta(minutes=30) == fresh(invoice).expires_at
    apply(quote, [paid(quote, 20 * USD, 0)], t0 + timedelta(minutes=29))  # a real partial payment does
    assert fresh(quote).expires_at == t0 + timedelta(minutes=59)


def test_the_dust_line_is_the_configured_share_exactly(placed, t0, settings):
    """PAYMENT_DUST_BPS = 100: a payment one base unit under 1 % of the quote is dust and
    extends nothing; exactly 1 % is a partial payment and keeps the quote open a window past it."""
    settings.PAYMENT_DUST_BPS = 100
    _, invoice, quote = placed
    apply(quote, [paid(quote, DUE // 100 - 1, 0)], t0 + timedelta(minutes=10))
    assert fresh(quote).expires_at == t0 + timedelta(minutes=30) == fresh(invoice).expires_at
    apply(quote, [paid(quote, DUE // 100, 0)], t0 + timedelta(minutes=29))
    assert fresh(quote).expires_at == t0 + timedelta(minutes=59) == fresh(invoice).expires_at


# --- 3. chain time, node health ------------------------------------------------------------------

def test_chain_time_decides_on_time_not_the_watchers_clock(placed, t0):
    _, invoice, quote = placed
    sent = t0 + timedelta(minutes=20)
    p = replace(paid(quote, DUE, 6), chain_time=int(sent.timestamp()))
    apply(quote, [p], t0 + timedelta(minutes=50))  # the watcher was down for half an hour
    assert Payment.objects.get().first_seen_at == sent
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.NONE)
    assert fresh(invoice).state == Invoice.State.PAID


class DownAdapter:
    coin = Coin.LTC
    required_confirmations = 6

    def scan(self, watch, cursor):
        raise ConnectionRefusedError("litecoind at 127.0.0.1:1 refused the connection")


class LaggingAdapter:
    """The offline LTC adapter (addresses) whose node's best block is ``tip`` (unix time)."""

    def __init__(self, tip):
        self.inner, self.tip = offline_adapters()[Coin.LTC], tip

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def scan(self, watch, cursor):
        return ScanResult([], {}, [])

    def tip_time(self):
        return self.tip


def test_a_coin_whose_node_fails_or_lags_is_not_offered_and_alerts(catalog, customer, t0, settings):
    settings.PAYMENT_NODE_MAX_TIP_AGE_MINUTES = 60
    set_rate("LTC", "100", t0)
    _, invoice = order(customer, t0, pay=False)
    adapters = offline_adapters()
    with coins_config.use_adapters({**adapters, Coin.LTC: DownAdapter()}):
        with pytest.raises(ConnectionRefusedError):
            watch_coin(coin="LTC", now=t0)
        assert coins_offered(t0) == [Coin.USDT]
        with pytest.raises(PaymentError, match="cannot watch the LTC network"):
            quote_create(invoice=invoice, coin="LTC", now=t0)
        alerts = dashboard(t0).alerts
        assert any("LTC" in a and "refused the connection" in a for a in alerts)
        assert AuditEntry.objects.filter(action="coin_node_failing").count() == 1
    with coins_config.use_adapters({**adapters, Coin.LTC: LaggingAdapter(int(t0.timestamp()) - 61 * 60)}):
        watch_coin(coin="LTC", now=t0)
        assert WatcherCursor.objects.get(coin="LTC").last_error == ""
        assert Coin.LTC not in coins_offered(t0)
        assert any("LTC" in a and "61 min old" in a for a in dashboard(t0).alerts)
    with coins_config.use_adapters({**adapters, Coin.LTC: LaggingAdapter(int(t0.timestamp()) - 60)}):
        watch_coin(coin="LTC", now=t0)
        assert coins_offered(t0) == [Coin.LTC, Coin.USDT]
        assert quote_create(invoice=invoice, coin="LTC", now=t0).coin == "LTC"
    assert AuditEntry.objects.filter(action="coin_node_recovered").count() == 1


# --- 4. reversal after settlement, speed policy ----------------------------------------------------

def test_reorg_after_settlement_takes_everything_back_suspends_after_the_grace_and_recovers(
        placed, customer, operator, t0, settings):
    """The claw-back policy: the invoice it paid and the overpayment credit are taken
    back in full (the balance goes negative: a debt, not a silent loss), the operator is
    alerted, the lease is suspended after PAYMENT_REVERSAL_GRACE_MINUTES and resumes once
    the next credit has paid the debt."""
    from billing.payments.reversals import sweep_reversed_payments
    from rental.agent import Instance
    from rental.services import lease_provisioned

    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 30
    lease, invoice, quote = placed
    p = paid(quote, DUE + 10 * USD, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    lease_provisioned(lease_id=lease.pk, instance=Instance("10.0.0.5", 2201), now=t0 + timedelta(minutes=4))
    assert fresh(invoice).state == Invoice.State.PAID and balance(customer) == 1000  # $10 overpaid
    ledger_post(customer=customer, kind=LedgerEntry.Kind.ADJUSTMENT, amount_cents=-400,
                now=t0 + timedelta(minutes=4), memo="$4 of it spent")
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert Payment.objects.get().state == PS.REORGED
    assert fresh(invoice).flag == "payment_reversed"
    assert credits(LedgerEntry.Kind.CLAWBACK) == [-7500] and balance(customer) == -6900  # owed, not lost
    review = PaymentReview.objects.get()
    assert (review.kind, review.clawed_back_cents, review.state) == (R.Kind.REVERSED, 7500, R.State.OPEN)
    apply(quote, [], t0 + timedelta(minutes=11), reorged=[(p.txid, 0)])  # reported twice: once
    assert credits(LedgerEntry.Kind.CLAWBACK) == [-7500] and PaymentReview.objects.count() == 1
    assert any("review" in a for a in dashboard(t0 + timedelta(minutes=12)).alerts)
    with pytest.raises(Exception, match="does not cover"):  # a negative balance buys nothing
        ledger_post(customer=customer, kind=LedgerEntry.Kind.ORDER, amount_cents=-1, now=t0, memo="x")

    assert sweep_reversed_payments(t0 + timedelta(minutes=39)) == []  # within the grace
    assert fresh(lease).state == LeaseState.ACTIVE
    assert len(sweep_reversed_payments(t0 + timedelta(minutes=41))) == 1
    assert fresh(lease).state == LeaseState.SUSPENDED
    balance_top_up(customer=customer, amount_cents=5000, now=t0 + timedelta(minutes=50))
    sweep_reversed_payments(t0 + timedelta(minutes=51))
    assert balance(customer) == -1900 and fresh(lease).state == LeaseState.SUSPENDED  # still owes $19
    balance_top_up(customer=customer, amount_cents=1900, now=t0 + timedelta(minutes=52))
    run_lifecycle(t0 + timedelta(minutes=53))
    assert balance(customer) == 0 and fresh(lease).state == LeaseState.ACTIVE
    assert fresh(invoice).flag == "payment_recovered"
    payment_review_close(review=review, actor=operator, now=t0 + timedelta(minutes=60), note="paid again")


def test_late_credit_reorged_away_is_taken_back(placed, customer, t0):
    _, _, quote = placed
    expire(quote, t0 + timedelta(minutes=31))
    set_rate("LTC", "100", t0 + timedelta(minutes=40))
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=40))
    assert balance(customer) == 6500
    apply(quote, [], t0 + timedelta(minutes=50), reorged=[(p.txid, 0)])
    assert balance(customer) == 0 and credits(LedgerEntry.Kind.CLAWBACK) == [-6500]
    assert fresh(quote).invoice.flag == ""  # it paid no invoice


def test_speed_policy_small_quotes_settle_with_fewer_confirmations(catalog, customer, coins, t0, settings):
    settings.PAYMENT_SPEED_POLICY = "10000:1,100000:3"
    set_rate("LTC", "100", t0)
    _, small = order(customer, t0, pay=False)  # $65: one confirmation
    _, big = order(customer, t0, pay=False, term="month")
    q_small = quote_create(invoice=small, coin="LTC", now=t0)
    q_big = quote_create(invoice=big, coin="LTC", now=t0)
    assert q_big.usd_cents >= 10000
    apply(q_small, [paid(q_small, int(q_small.amount), 1)], t0)
    apply(q_big, [paid(q_big, int(q_big.amount), 2)], t0)
    assert fresh(q_small).state == Q.SETTLED
    assert fresh(q_big).state == Q.PROCESSING
    expected = 3 if q_big.usd_cents < 100000 else 6
    apply(q_big, [paid(q_big, int(q_big.amount), expected, Payment.objects.get(quote=q_big).txid)], t0)
    assert fresh(q_big).state == Q.SETTLED


@pytest.mark.parametrize("policy,settled_with_one", [("6500:1", False), ("6501:1", True)])
def test_the_speed_policy_applies_below_its_amount_not_at_it(placed, settings, t0, policy, settled_with_one):
    """PAYMENT_SPEED_POLICY "<cents>:<confirmations>": a quote worth LESS than the cents needs
    that many; the $65.00 quote at "6500:1" is not below it and waits for the coin's count."""
    settings.PAYMENT_SPEED_POLICY = policy
    _, invoice, quote = placed
    apply(quote, [paid(quote, DUE, 1)], t0 + timedelta(minutes=2))
    assert (fresh(quote).state == Q.SETTLED) is settled_with_one
    assert (fresh(invoice).state == Invoice.State.PAID) is settled_with_one


def test_a_payment_first_seen_at_the_expiry_second_is_on_time(placed, t0):
    """On time means first seen on the chain by the quote's expiry, its own second included:
    it pays the invoice, it is not a late payment credited to the balance."""
    _, invoice, quote = placed
    at_expiry = replace(paid(quote, DUE, 6), chain_time=int(quote.expires_at.timestamp()))
    apply(quote, [at_expiry], quote.expires_at)
    assert fresh(invoice).state == Invoice.State.PAID
    assert credits(LedgerEntry.Kind.LATE_PAYMENT) == []


def test_an_extra_payment_is_credited_from_one_cent_and_under_a_cent_leaves_no_line(placed, customer, t0):
    """Cents are rounded down; an extra payment worth under a cent is settled with nothing to
    credit (no ledger line, no review), one worth a cent is credited that cent."""
    _, _, quote = placed  # $100/LTC: 10,000 litoshi a cent
    settled = t0 + timedelta(minutes=5)
    apply(quote, [paid(quote, DUE, 6)], settled)
    under = replace(paid(quote, 9_999, 6), chain_time=int(settled.timestamp()))
    one = replace(paid(quote, 10_000, 6), chain_time=int(settled.timestamp()))
    apply(quote, [under, one], settled + timedelta(minutes=1))
    assert credits(LedgerEntry.Kind.EXCESS_PAYMENT) == [1] and balance(customer) == 1
    assert sorted(Payment.objects.filter(amount__lt=DUE).values_list("amount", "credited_cents")) == [
        (9_999, 0), (10_000, 1)]
    assert not PaymentReview.objects.exists()


def test_an_invoice_paid_from_the_balance_meanwhile_is_not_paid_twice(placed, customer, t0):
    _, invoice, quote = placed
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    invoice_pay_from_balance(invoice=invoice, now=t0)
    apply(quote, [paid(quote, DUE, 6)], t0 + timedelta(minutes=2))
    assert credits(LedgerEntry.Kind.EXCESS_PAYMENT) == [6500]


def test_operator_decides_reviews_in_the_admin(placed, customer, operator, client, t0):
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    _, _, quote = placed
    expire(quote, t0 + timedelta(minutes=31))
    apply(quote, [paid(quote, DUE, 6)], t0 + timedelta(hours=3))  # no fresh rate: held
    apply(quote, [paid(quote, 2 * USD, 6)], t0 + timedelta(hours=3))
    held, other = PaymentReview.objects.order_by("pk")
    set_rate("LTC", "100", timezone.now())
    client.force_login(operator)
    url = "/admin/billing/paymentreview/"
    assert client.get(url).status_code == 200
    page = client.post(url, {"action": "credit_reviews", ACTION_CHECKBOX_NAME: [held.pk]})
    assert page.status_code == 200 and "I checked the payment on the chain" in page.content.decode()
    client.post(url, {"action": "credit_reviews", ACTION_CHECKBOX_NAME: [held.pk], "post": "yes", "confirm": "on"})
    assert fresh(held).state == R.State.CREDITED and balance(customer) == 6500
    client.post(url, {"action": "close_reviews", ACTION_CHECKBOX_NAME: [other.pk], "post": "yes",
                      "reason": "customer asked for a refund, sent on-chain"})
    assert fresh(other).state == R.State.CLOSED and fresh(other).decided_by == operator
    assert balance(customer) == 6500


# --- 9. quote limits ----------------------------------------------------------------------------

def test_quotes_are_rate_limited_per_customer(catalog, customer, other_customer, coins, t0, settings):
    settings.QUOTES_PER_CUSTOMER_PER_HOUR = 2
    settings.MAX_OPEN_UNPAID_ORDERS = 3  # three open orders to quote for (the hoarding limit is tested elsewhere)
    set_rate("LTC", "100", t0)
    invoices = [order(customer, t0, pay=False)[1] for _ in range(3)]
    quote_create(invoice=invoices[0], coin="LTC", now=t0)
    quote_create(invoice=invoices[1], coin="LTC", now=t0)
    assert quote_create(invoice=invoices[1], coin="LTC", now=t0).pk  # the open quote again: no new address
    with pytest.raises(PaymentError, match="many payment addresses"):
        quote_create(invoice=invoices[2], coin="USDT", now=t0)
    _, theirs = order(other_customer, t0, pay=False)
    assert quote_create(invoice=theirs, coin="LTC", now=t0)  # others are not limited by it


def test_the_gap_limit_is_per_customer_and_a_coin_they_cannot_use_is_not_offered_to_them(
        catalog, customer, coins, t0, settings, django_user_model):
    """Unpaid top-up quotes of one customer used to exhaust the wallet's gap for
    everybody (ETH, USDT and USDC share one counter). Now that customer alone is refused
    and no longer offered the wallet's coins; others are served, the operator is warned."""
    from billing.models import CoinWallet
    from billing.payments.services import coins_offered, wallet_gap_exceeded
    from billing.services import topup_invoice_create
    from ops.backoffice.dashboard import dashboard

    settings.ADDRESSES_UNPAID_PER_CUSTOMER = 3
    set_rate("LTC", "100", t0)
    CoinWallet.objects.create(coin="LTC", next_index=20, highest_paid_index=-1)  # 0..19 unpaid (others')
    CoinWallet.objects.create(coin="ETH", next_index=0)
    topups = [topup_invoice_create(customer=customer, amount_cents=1000, now=t0) for _ in range(5)]
    quote_create(invoice=topups[0], coin="LTC", now=t0)
    quote_create(invoice=topups[1], coin="USDT", now=t0)  # another wallet: its own count
    quote_create(invoice=topups[2], coin="LTC", now=t0)
    quote_create(invoice=topups[3], coin="LTC", now=t0)
    assert coins_offered(t0, customer=customer) == [Coin.USDT]
    with pytest.raises(PaymentError, match="3 unpaid LTC payment addresses"):
        quote_create(invoice=topups[4], coin="LTC", now=t0)
    assert CoinWallet.objects.get(coin="LTC").next_index == 23
    other = django_user_model.objects.create_user(username="bob", password="x" * 20)
    _, theirs = order(other, t0, pay=False)
    assert coins_offered(t0, customer=other) == [Coin.LTC, Coin.USDT]
    assert quote_create(invoice=theirs, coin="LTC", now=t0).derivation_index == 23  # not refused
    assert wallet_gap_exceeded(CoinWallet.objects.get(coin="LTC"))
    assert any("gap limit" in a for a in dashboard(t0).alerts)
    first = Quote.objects.get(invoice=topups[0])
    apply(first, [paid(first, int(first.amount), 0)], t0)  # a payment: its address no longer counts
    assert quote_create(invoice=topups[4], coin="LTC", now=t0).derivation_index == 24


def test_a_quote_taken_late_in_the_order_window_still_gets_the_minimum(catalog, customer, coins, t0, settings):
    settings.PAYMENT_QUOTE_MIN_MINUTES = 10
    set_rate("LTC", "100", t0 + timedelta(minutes=28))
    _, invoice = order(customer, t0, pay=False)
    quote = quote_create(invoice=invoice, coin="LTC", now=t0 + timedelta(minutes=28))
    assert quote.expires_at == t0 + timedelta(minutes=38) == fresh(invoice).expires_at


def test_a_monero_wallet_rpc_error_is_a_message_not_a_500(catalog, customer, client, t0):
    from billing.payments.coins.monero import MoneroAdapter, MoneroWalletRpc
    from tests.billing.chain_daemons import free_port

    set_rate("XMR", "150", timezone.now())
    _, invoice = order(customer, timezone.now(), pay=False)
    down = MoneroAdapter(MoneroWalletRpc(f"http://127.0.0.1:{free_port()}/json_rpc", timeout=2))
    client.force_login(customer)
    with coins_config.use_adapters({Coin.XMR: down}):
        page = client.post(f"/pay/invoice/{invoice.pk}/", {"coin": "XMR"}, follow=True)
    assert page.status_code == 200 and "cannot create a Monero address right now" in page.content.decode()
    assert not Quote.objects.exists()


def test_the_invoice_page_lists_its_quotes_and_a_reversal(placed, customer, client, t0):
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=9), reorged=[(p.txid, 0)])
    client.force_login(customer)
    page = client.get(f"/billing/invoices/{invoice.pk}/").content.decode()
    assert f"/pay/quote/{quote.pk}/" in page and "was reversed on its chain" in page


def test_coins_of_the_same_wallet_sent_to_a_quote_in_another_coin_wait_for_an_operator(
        catalog, customer, operator, coins, t0):
    """Misdirected coins, without a chain (test_adversarial_chains.py has them on anvil):
    USDC and ETH sent to a USDT quote's address open one review each once confirmed, worth
    the sent coin at its rate (no rate: no proposed amount); they pay nothing of the quote, and
    an address that is no quote's, or a coin of another wallet, is nobody's review."""
    from billing.payments.coins.base import DetectedPayment
    from billing.payments.misdirected import misdirected_report

    _, invoice = order(customer, t0, pay=False)
    quote = quote_create(invoice=invoice, coin="USDT", now=t0)
    set_rate("ETH", "2000", t0)
    usdc = DetectedPayment(Coin.USDC, "c" * 64, 1, quote.address.lower(), 65_000_000, 11, "b" * 64, 100)
    assert misdirected_report(coin=Coin.USDC, payment=usdc, required=12, now=t0) is True  # not yet confirmed
    assert not PaymentReview.objects.exists()
    usdc = replace(usdc, confirmations=12)
    eth = DetectedPayment(Coin.ETH, "e" * 64, 0, quote.address, 10**16, 12, "b" * 64, 100)
    for _ in range(2):  # reported once per transfer
        assert misdirected_report(coin=Coin.USDC, payment=usdc, required=12, now=t0 + timedelta(minutes=1))
        assert misdirected_report(coin=Coin.ETH, payment=eth, required=12, now=t0 + timedelta(minutes=1))
    assert misdirected_report(coin=Coin.USDC, payment=replace(usdc, output_index=2), required=12, now=t0)
    reviews = list(PaymentReview.objects.order_by("pk"))
    assert [(r.kind, r.quote, r.sent_coin, r.txid, int(r.amount), r.proposed_cents, r.state, r.created_at)
            for r in reviews] == [
        (R.Kind.MISDIRECTED, quote, "USDC", "c" * 64, 65_000_000, 6500, R.State.OPEN, t0 + timedelta(minutes=1)),
        (R.Kind.MISDIRECTED, quote, "ETH", "e" * 64, 10**16, 2000, R.State.OPEN, t0 + timedelta(minutes=1)),
        (R.Kind.MISDIRECTED, quote, "USDC", "c" * 64, 65_000_000, 6500, R.State.OPEN, t0),  # another output
    ]
    assert reviews[0].payment is None and not Payment.objects.exists()
    assert fresh(invoice).state == Invoice.State.OPEN and fresh(quote).state == quote.state

    # an ETH payment without a fresh rate: reviewed, the operator prices it when crediting
    stale = DetectedPayment(Coin.ETH, "f" * 64, 0, quote.address, 10**16, 12, "b" * 64, 100)
    set_rate("ETH", "2000", t0 - timedelta(days=1))
    assert misdirected_report(coin=Coin.ETH, payment=stale, required=12, now=t0)
    assert PaymentReview.objects.get(txid="f" * 64).proposed_cents is None
    # USDT to the USDT quote is no misdirection (the quote's own coin), LTC shares no wallet with it,
    # and an address that is no quote's is not ours to review
    own = DetectedPayment(Coin.USDT, "a" * 64, 0, quote.address, 1, 12, "b" * 64, 100)
    assert misdirected_report(coin=Coin.USDT, payment=own, required=12, now=t0) is False
    ltc = DetectedPayment(Coin.LTC, "d" * 64, 0, quote.address, 1, 12, "b" * 64, 100)
    assert misdirected_report(coin=Coin.LTC, payment=ltc, required=6, now=t0) is False
    nobody = replace(usdc, address="0x" + "9" * 40, txid="9" * 64)
    assert misdirected_report(coin=Coin.USDC, payment=nobody, required=12, now=t0) is False
    assert PaymentReview.objects.count() == 4
    payment_review_credit(review=reviews[0], actor=operator, now=t0 + timedelta(minutes=5))
    assert balance(customer) == 6500  # the USDC at its peg, one click
