"""Reconciling a quote after its payments move on the chain
(billing.payments.reversals.quote_reconcile, services._credit_unsettled): the claw-back and
the give-back are ledger rows on the invoice the payment paid, with the memo the customer
reads; the lease suspended for the debt resumes when the payment returns; a fee bump of a
reversed payment fills the settlement again (no extra credit) while a further payment is
still credited; an underpayment within the tolerance is never taken back; a forgiven debt,
even of one cent, is not given back twice; and what quote_reconcile reports."""
from datetime import timedelta

import pytest
from django.db import transaction

from billing.models import LedgerEntry, Payment, PaymentReview, Quote
from billing.payments.credits import payment_review_credit
from billing.payments.reversals import quote_reconcile
from ops.lifecycle import run_lifecycle
from rental.agent import Instance
from rental.models import LeaseEvent, LeaseState
from rental.services import lease_provisioned
from tests.billing.payments_helpers import DUE, USD, apply, balance, fresh, paid, set_rate

pytestmark = pytest.mark.django_db

CENT = USD // 100  # litoshi worth one cent at $100/LTC


def rows(customer):
    return [(e.kind, e.amount_cents, e.invoice_id, e.memo)
            for e in LedgerEntry.objects.filter(account__customer=customer).order_by("pk")]


def kinds(customer):
    return [(e.kind, e.amount_cents) for e in LedgerEntry.objects.filter(account__customer=customer).order_by("pk")]


def reconcile(quote, now):
    """As its callers do: with the quote's row locked."""
    with transaction.atomic():
        locked = Quote.objects.select_for_update().select_related("invoice").get(pk=quote.pk)
        return quote_reconcile(locked, now)


def test_a_reversal_and_its_return_are_ledger_rows_on_the_invoice_and_the_lease_resumes_when_paid_again(
        placed, customer, t0, settings):
    """The settlement's payment leaves the chain: $65.00 is taken back on the invoice it paid,
    with a memo saying why; the lease is suspended once the grace has passed. The payment is
    mined again: $65.00 is given back on the same invoice, the reversal's review is closed at
    that moment, and the lease resumes at that moment."""
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 0
    lease, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    assert lease_provisioned(lease_id=lease.pk, instance=Instance("10.0.0.9", 2209), now=t0 + timedelta(minutes=4))

    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert rows(customer) == [
        ("clawback", -6500, invoice.pk, f"LTC quote #{quote.pk}: a payment left the chain after it counted")]
    run_lifecycle(t0 + timedelta(minutes=11))
    assert fresh(lease).state == LeaseState.SUSPENDED

    returned = t0 + timedelta(minutes=20)
    apply(quote, [paid(quote, DUE, 6, p.txid)], returned)
    assert rows(customer)[1:] == [
        ("restored", 6500, invoice.pk, f"LTC quote #{quote.pk}: the reversed payment is back on the chain")]
    assert balance(customer) == 0
    review = PaymentReview.objects.get(kind="reversed")
    assert (review.state, review.decided_at, review.decided_by) == ("closed", returned, None)
    assert fresh(invoice).flag == "payment_recovered" and fresh(lease).state == LeaseState.ACTIVE
    assert list(LeaseEvent.objects.filter(lease=lease, kind="resumed").values_list("at", flat=True)) == [returned]


def test_a_fee_bump_of_a_reversed_payment_pays_the_invoice_again_and_a_further_payment_is_credited(
        placed, customer, t0):
    """The settlement's payment is double-spent by its own fee bump (same outputs, new txid).
    The bump fills the settlement again: what was taken is given back and it is no extra
    credit. A $5.00 payment confirmed with it is beyond the settlement: credited on its own."""
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert balance(customer) == -6500

    set_rate("LTC", "100", t0 + timedelta(minutes=19))  # a fresh rate for the extra credit
    bump, extra = paid(quote, DUE, 6), paid(quote, 5 * USD, 6)
    apply(quote, [bump, extra], t0 + timedelta(minutes=20))
    assert kinds(customer) == [("clawback", -6500), ("excess_payment", 500), ("restored", 6500)]
    assert balance(customer) == 500
    settled = {r.txid: (r.in_settlement, r.credited_cents) for r in Payment.objects.filter(quote=quote)}
    assert settled == {p.txid: (True, None), bump.txid: (True, None), extra.txid: (False, 500)}
    assert PaymentReview.objects.get(kind="reversed").state == "closed"
    assert fresh(invoice).flag == "payment_recovered" and fresh(quote).state == "settled"

    apply(quote, [bump, extra], t0 + timedelta(minutes=30))  # seen again: nothing more posted
    assert balance(customer) == 500 and len(kinds(customer)) == 3


def test_a_settlement_underpaid_within_the_tolerance_is_never_taken_back(placed, customer, t0, settings):
    """0.5 % short is accepted as payment in full: the invoice is paid and the balance is not
    charged the few cents missing, now or on later scans."""
    settings.UNDERPAYMENT_TOLERANCE_BPS = 50
    _, invoice, quote = placed
    p = paid(quote, DUE - DUE * 50 // 10_000, 6)  # $64.675
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [p], t0 + timedelta(minutes=5))
    assert fresh(quote).state == "settled" and fresh(invoice).state == "paid"
    assert kinds(customer) == [] and balance(customer) == 0
    assert not PaymentReview.objects.exists() and fresh(invoice).flag != "payment_reversed"


def test_a_forgiven_one_cent_reversal_is_not_given_back_again_when_the_payment_returns(
        placed, customer, operator, t0):
    """An extra payment worth exactly one cent is credited, leaves the chain (the cent is taken
    back) and an operator forgives that cent. When the payment is mined again the cent is not
    given back a second time: one payment on the chain, one credit."""
    _, _, quote = placed
    apply(quote, [paid(quote, DUE, 6)], t0 + timedelta(minutes=3))
    cent = paid(quote, CENT, 6)
    apply(quote, [cent], t0 + timedelta(minutes=5))
    assert kinds(customer) == [("excess_payment", 1)]
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(cent.txid, 0)])
    assert kinds(customer) == [("excess_payment", 1), ("clawback", -1)]
    payment_review_credit(review=PaymentReview.objects.get(kind="reversed"), actor=operator,
                          now=t0 + timedelta(minutes=11))
    apply(quote, [paid(quote, CENT, 6, cent.txid)], t0 + timedelta(minutes=20))
    assert kinds(customer) == [("excess_payment", 1), ("clawback", -1), ("late_payment", 1)]
    assert balance(customer) == 1


def test_quote_reconcile_reports_the_cents_it_posted(placed, customer, t0):
    """quote_reconcile returns what it posted: nothing (0) while every payment that counted
    is on the chain, -6500 when the settlement's payment has left it, then 0 again (already
    taken back), and +6500 when the payment is back."""
    _, _, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    assert reconcile(quote, t0 + timedelta(minutes=4)) == 0
    assert kinds(customer) == []

    Payment.objects.filter(txid=p.txid).update(state=Payment.State.REORGED)
    assert reconcile(quote, t0 + timedelta(minutes=10)) == -6500
    assert reconcile(quote, t0 + timedelta(minutes=11)) == 0
    assert kinds(customer) == [("clawback", -6500)]

    Payment.objects.filter(txid=p.txid).update(state=Payment.State.CONFIRMED)
    assert reconcile(quote, t0 + timedelta(minutes=20)) == 6500
    assert kinds(customer) == [("clawback", -6500), ("restored", 6500)] and balance(customer) == 0
