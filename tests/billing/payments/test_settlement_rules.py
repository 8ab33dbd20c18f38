"""The settlement and crediting rules the mutation run found untested — when a
quote counts as settled (the locked rate ends there), what a settlement in several parts
credits, an order cancelled before its coins confirmed, each held payment in its own review,
and what a payment's row says after it left the chain or the mempool and came back."""
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection

from billing.models import Invoice, LedgerEntry, Payment, PaymentReview, Quote
from billing.payments.coins.base import ScanResult
from billing.payments.credits import payment_review_credit
from billing.payments.services import payments_apply_scan, sweep_expire_quotes
from billing.refunds import lease_refund
from ops.backoffice.exports import iso, payment_rows
from ops.lifecycle import run_lifecycle
from rental.models import LeaseState
from tests.billing.payments_helpers import DUE, USD, apply, balance, credits, fresh, paid, set_rate

Q, X, PS, R = Quote.State, Quote.Exception_, Payment.State, PaymentReview
pytestmark = pytest.mark.django_db


def seen_at(detected, at):
    """The payment as the chain dates it (mempool entry / block time)."""
    return replace(detected, chain_time=int(at.timestamp()))


# --- settlement ----------------------------------------------------------------------------------

def test_a_payment_after_the_settlement_but_before_the_expiry_takes_the_rate_when_it_confirms(placed, customer, t0):
    """The locked rate ends when the quote settles, not only at its expiry: coins first seen
    after the settlement are an extra payment, credited at the rate when they confirm, and the
    ledger line points at the invoice the quote was for."""
    _, invoice, quote = placed  # $100/LTC, expires at t0 + 30 min
    settled = t0 + timedelta(minutes=5)
    apply(quote, [paid(quote, DUE, 6)], settled)
    assert (fresh(quote).state, quote.settled_at) == (Q.SETTLED, settled)

    after = t0 + timedelta(minutes=10)  # still before the quote's expiry
    set_rate("LTC", "200", after)
    apply(quote, [seen_at(paid(quote, 10 * USD, 6, "ef" * 32), after)], after)
    entry = LedgerEntry.objects.get(kind=LedgerEntry.Kind.EXCESS_PAYMENT)
    assert (entry.amount_cents, entry.invoice_id) == (2000, invoice.pk)  # $20, not the quoted $10
    assert entry.memo == f"LTC efefefefefefefef…:0 to quote #{quote.pk} at $200/LTC (when confirmed)"
    assert balance(customer) == 2000


def test_an_invoice_paid_on_time_in_three_parts_credits_the_excess_once(placed, customer, t0):
    """$40 + $30 + $5 for a $65 order, confirmed in the same pass: the three pay the invoice
    together and what they exceed it by, $10, reaches the balance once, as the quote's excess —
    the last part is not credited a second time on its own."""
    _, invoice, quote = placed
    parts = [paid(quote, 40 * USD, 6), paid(quote, 30 * USD, 6), paid(quote, 5 * USD, 6)]
    apply(quote, parts, t0 + timedelta(minutes=3))
    apply(quote, parts, t0 + timedelta(minutes=4))  # the next pass reports them again
    assert fresh(invoice).state == Invoice.State.PAID
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.OVER)
    assert list(LedgerEntry.objects.filter(kind=LedgerEntry.Kind.EXCESS_PAYMENT)
                .values_list("amount_cents", "idempotency_key")) == [(1000, f"excess:{quote.pk}")]
    assert balance(customer) == 1000
    assert sorted(Payment.objects.values_list("amount", "in_settlement", "credited_cents")) == [
        (5 * USD, True, None), (30 * USD, True, None), (40 * USD, True, None)]


def test_coins_for_an_order_cancelled_before_they_confirmed_go_to_the_balance_as_a_late_payment(
        placed, customer, t0):
    """The customer cancels the unpaid order while the coins they sent in time still confirm:
    the invoice stays void, the whole amount goes to the balance as a late payment (not an
    overpayment of a paid invoice), and the quote says so."""
    lease, invoice, quote = placed
    sent = t0 + timedelta(minutes=2)
    apply(quote, [paid(quote, DUE, 0, "aa" * 32)], sent)
    assert lease_refund(lease=lease, actor=customer, now=t0 + timedelta(minutes=3)) == 0
    assert (fresh(lease).state, fresh(invoice).state) == (LeaseState.CANCELLED, Invoice.State.VOID)

    apply(quote, [seen_at(paid(quote, DUE, 6, "aa" * 32), sent)], t0 + timedelta(minutes=20))
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.LATE)
    assert fresh(invoice).state == Invoice.State.VOID
    entry = LedgerEntry.objects.get(amount_cents__gt=0)
    assert (entry.kind, entry.amount_cents, entry.memo) == (
        LedgerEntry.Kind.LATE_PAYMENT, 6500, f"LTC quote #{quote.pk}: invoice #{invoice.pk} was already void")
    assert balance(customer) == 6500


# --- held for an operator ------------------------------------------------------------------------

def test_each_extra_payment_past_the_cap_waits_in_its_own_review(placed, customer, operator, t0):
    """Past the quote's automatic cap (100 % of $65 by default) every payment is held on its
    own: one review per payment, naming it and its coins, the payment not credited; once an
    operator credits a review, that payment is credited and no later pass credits it again."""
    _, _, quote = placed
    apply(quote, [paid(quote, DUE, 6)], t0 + timedelta(minutes=5))  # settled, nothing extra
    later = t0 + timedelta(hours=1)
    set_rate("LTC", "100", later)
    first, second = paid(quote, 70 * USD, 6), paid(quote, 80 * USD, 6)
    apply(quote, [first, second], later)

    reviews = list(PaymentReview.objects.order_by("pk"))
    assert [(r.kind, r.payment.txid, int(r.amount), r.proposed_cents, r.state) for r in reviews] == [
        (R.Kind.OVER_CAP, first.txid, 70 * USD, 7000, R.State.OPEN),
        (R.Kind.OVER_CAP, second.txid, 80 * USD, 8000, R.State.OPEN)]
    assert list(Payment.objects.filter(amount__gt=DUE).values_list("credited_cents", flat=True)) == [None, None]
    assert balance(customer) == 0

    payment_review_credit(review=reviews[0], actor=operator, now=later + timedelta(minutes=1))
    apply(quote, [first, second], later + timedelta(minutes=2))  # the next pass: nothing new
    assert Payment.objects.get(txid=first.txid).credited_cents == 7000
    assert Payment.objects.get(txid=second.txid).credited_cents is None
    assert balance(customer) == 7000 and PaymentReview.objects.count() == 2


# --- a payment's row after it left and came back ---------------------------------------------------

def test_the_payments_export_says_when_each_payment_confirmed(placed, t0):
    """The accounting export's confirmed_at is the watcher pass that saw the confirmations;
    later reports of the same payment (a second watcher, the next pass) do not move it."""
    _, _, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=1))
    apply(quote, [replace(p, confirmations=6)], t0 + timedelta(minutes=12))
    apply(quote, [replace(p, confirmations=7)], t0 + timedelta(minutes=20))
    header, row = payment_rows(t0, t0 + timedelta(hours=1))
    assert dict(zip(header, row, strict=True))["confirmed_at"] == iso(t0 + timedelta(minutes=12))
    assert dict(zip(header, row, strict=True))["state"] == PS.CONFIRMED


def test_a_payment_evicted_from_the_mempool_and_rebroadcast_counts_again_while_it_confirms(placed, t0):
    """A payment the node dropped (evicted) and that is back in the mempool counts again before
    it is mined: seen, with no drop reason left, and the quote waits for its confirmations."""
    _, invoice, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=1))
    payments_apply_scan(coin="LTC", scan=ScanResult([], {}, [], [(p.txid, 0, "evicted")]),
                        now=t0 + timedelta(minutes=2))
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.INVALID, "evicted")
    assert fresh(quote).state == Q.INVALID

    apply(quote, [p], t0 + timedelta(minutes=3))  # rebroadcast, not mined yet
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.SEEN, "")
    assert (fresh(quote).state, quote.received) == (Q.PROCESSING, DUE)
    assert fresh(invoice).state == Invoice.State.OPEN


def test_a_payment_reorged_away_that_comes_back_mined_is_confirmed_with_no_reason_left(placed, t0):
    """A settled payment that left the chain in a reorg and is mined again confirms again: the
    row reads confirmed, without the reorg's reason, and the invoice stays paid."""
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=5), reorged=[(p.txid, 0)])
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.REORGED, "reorged")

    apply(quote, [p], t0 + timedelta(minutes=7))
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.CONFIRMED, "")
    assert fresh(invoice).state == Invoice.State.PAID


def test_a_payment_unconfirmed_past_the_monitoring_window_counts_again_once_mined(placed, t0, settings):
    """Unconfirmed past PAYMENT_MONITORING_MINUTES, a payment is invalid and reported again
    from the mempool it stays so; once mined (one confirmation of six) it counts again,
    seen with no reason left, and when confirmed it reaches the balance (the quote expired
    meanwhile; it was sent on time, so at the quoted rate)."""
    settings.PAYMENT_MONITORING_MINUTES = 120
    _, _, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=1))
    sweep_expire_quotes(t0 + timedelta(minutes=122))
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.INVALID, "unconfirmed_too_long")

    apply(quote, [p], t0 + timedelta(minutes=125))  # still in some mempool
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.INVALID, "unconfirmed_too_long")
    apply(quote, [replace(p, confirmations=1)], t0 + timedelta(minutes=130))
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.SEEN, "")
    assert fresh(quote).received == DUE

    apply(quote, [replace(p, confirmations=6)], t0 + timedelta(minutes=140))
    assert Payment.objects.values_list("state", "invalid_reason").get() == (PS.CONFIRMED, "")
    assert credits(LedgerEntry.Kind.LATE_PAYMENT) == [6500]


# --- the expiry sweep -----------------------------------------------------------------------------

def test_the_expiry_sweep_expires_an_unpaid_quote_and_reports_it(placed, t0):
    """Runs on PostgreSQL too: the sweep locks the quote row alone (FOR UPDATE OF the quote)."""
    lease, _, quote = placed
    after = t0 + timedelta(minutes=31)
    report = sweep_expire_quotes(after)
    assert [(t.lease_id, t.what) for t in report] == [(lease.pk, f"quote #{quote.pk} expired")]
    assert fresh(quote).state == Q.EXPIRED
    run_lifecycle(after)
    assert fresh(lease).state == LeaseState.CANCELLED


def test_a_quote_a_watcher_settles_while_the_sweep_gets_to_it_is_neither_expired_nor_reported(placed, t0):
    """The sweep lists the quotes past their expiry, then takes each one's row lock; a watcher
    that settled one in between (coins the chain dates on time) wins: the sweep leaves it
    settled and does not report it as expired in the lifecycle pass."""
    lease, invoice, quote = placed
    after = t0 + timedelta(minutes=31)
    on_time = seen_at(paid(quote, DUE, 6), t0 + timedelta(minutes=29))
    settled_first = []

    def watcher_settles_before_the_sweep_reads_the_quote(execute, sql, params, many, context):
        reads_one_quote = 'FROM "billing_quote"' in sql and '"billing_quote"."id" =' in sql
        if reads_one_quote and not settled_first:
            settled_first.append(True)
            apply(quote, [on_time], after)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watcher_settles_before_the_sweep_reads_the_quote):
        report = sweep_expire_quotes(after)
    assert settled_first and report == []
    assert (fresh(quote).state, fresh(invoice).state) == (Q.SETTLED, Invoice.State.PAID)
    assert fresh(lease).state == LeaseState.PROVISIONING
