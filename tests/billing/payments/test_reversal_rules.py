"""The claw-back rules one by one (billing.payments.reversals): what a reversal takes
back when the quote also credited extra payments or did not pay the invoice itself, one review
per reversed payment, the audit row, the grace counted from the first reversal, reviews closed
only once everything is given back (and only the open reversal reviews), operators' decisions
left alone, and a lease suspended for another reason not resumed by a recovered debt."""
from datetime import timedelta

import pytest

from billing.models import LedgerEntry, Payment, PaymentReview
from billing.payments.credits import payment_review_close, payment_review_credit
from billing.payments.pricing import PaymentError
from billing.services import balance_top_up, invoice_settle_manually
from inventory.models import AuditEntry
from ops.lifecycle import run_lifecycle
from rental.agent import Instance
from rental.models import LeaseEvent, LeaseState
from rental.services import lease_provisioned, lease_suspend
from tests.billing.payments_helpers import DUE, USD, apply, balance, fresh, paid, set_rate

pytestmark = pytest.mark.django_db

RETURNED_NOTE = "paid again on the chain; what was taken is given back"


def kinds(customer):
    return [(e.kind, e.amount_cents) for e in LedgerEntry.objects.filter(account__customer=customer).order_by("pk")]


def reversal_reviews():
    return [(r.payment.txid if r.payment else None, r.proposed_cents, r.clawed_back_cents, r.state)
            for r in PaymentReview.objects.filter(kind="reversed").select_related("payment").order_by("pk")]


def reversal_audits(invoice):
    return [e.detail for e in AuditEntry.objects.filter(action="payment_reversed", object_type="billing.Invoice",
                                                        object_id=str(invoice.pk)).order_by("pk")]


def start(lease, at):
    assert lease_provisioned(lease_id=lease.pk, instance=Instance("10.0.0.9", 2209), now=at)


def test_each_reversed_payment_has_its_review_and_the_grace_counts_from_the_first_reversal(
        placed, customer, t0, settings):
    """Two payments settle the quote together; they leave the chain one after the other.
    Each reversal takes back its share (in cents), opens a review for that payment only and
    writes an audit row saying what was taken; the invoice is flagged once, so the lease is
    suspended a grace after the FIRST reversal. Half given back leaves both reviews open;
    all given back closes them, recovers the invoice and resumes the lease."""
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 60
    lease, invoice, quote = placed
    a, b = paid(quote, DUE // 2, 6), paid(quote, DUE // 2, 6)
    apply(quote, [a, b], t0 + timedelta(minutes=3))
    assert fresh(invoice).state == "paid" and balance(customer) == 0
    start(lease, t0 + timedelta(minutes=4))

    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(a.txid, 0)])
    assert balance(customer) == -3250 and kinds(customer) == [("clawback", -3250)]
    assert reversal_reviews() == [(a.txid, 3250, 3250, "open")]  # b is still on the chain: no review
    assert (fresh(invoice).flag, invoice.flagged_at) == ("payment_reversed", t0 + timedelta(minutes=10))
    assert reversal_audits(invoice) == [{"quote": quote.pk, "taken_cents": 3250}]

    apply(quote, [], t0 + timedelta(minutes=40), reorged=[(b.txid, 0)])
    assert balance(customer) == -6500 and kinds(customer) == [("clawback", -3250), ("clawback", -3250)]
    assert reversal_reviews() == [(a.txid, 3250, 3250, "open"), (b.txid, 3250, 3250, "open")]
    assert fresh(invoice).flagged_at == t0 + timedelta(minutes=10)  # flagged since the first reversal
    assert reversal_audits(invoice) == [{"quote": quote.pk, "taken_cents": 3250}] * 2

    run_lifecycle(t0 + timedelta(minutes=71))  # 61 minutes after the first reversal, 31 after the second
    assert fresh(lease).state == LeaseState.SUSPENDED

    apply(quote, [paid(quote, DUE // 2, 6, a.txid)], t0 + timedelta(minutes=80))  # a is mined again
    assert balance(customer) == -3250 and kinds(customer)[-1] == ("restored", 3250)
    assert [r[3] for r in reversal_reviews()] == ["open", "open"]  # b's 3250 is still owed
    assert fresh(invoice).flag == "payment_reversed" and fresh(lease).state == LeaseState.SUSPENDED

    returned = t0 + timedelta(minutes=90)
    apply(quote, [paid(quote, DUE // 2, 6, b.txid)], returned)  # and b
    assert balance(customer) == 0 and kinds(customer)[-1] == ("restored", 3250)
    closed = list(PaymentReview.objects.filter(kind="reversed").values_list("state", "decided_at", "decided_by",
                                                                           "note"))
    assert closed == [("closed", returned, None, RETURNED_NOTE)] * 2
    assert fresh(invoice).flag == "payment_recovered" and fresh(lease).state == LeaseState.ACTIVE


def test_a_reversed_settlement_takes_back_the_invoice_and_leaves_extra_payments_credited(placed, customer, t0):
    """The settlement's payment leaves the chain: exactly the invoice's $65.00 is taken back.
    The extra payments sent after it are still on the chain and keep their credit ($5.00, and
    nothing for one worth less than a cent)."""
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [paid(quote, 5 * USD, 6), paid(quote, 5_000, 6)], t0 + timedelta(minutes=5))  # $5, and $0.005
    assert balance(customer) == 500
    assert sorted(Payment.objects.filter(in_settlement=False).values_list("credited_cents", flat=True)) == [0, 500]

    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert kinds(customer) == [("excess_payment", 500), ("clawback", -6500)]
    assert balance(customer) == -6000 and fresh(invoice).flag == "payment_reversed"


def test_a_payment_for_an_invoice_an_operator_settled_by_hand_takes_back_only_its_credit(
        placed, customer, operator, t0):
    """The operator settled the invoice by hand, citing the quote; the quote's payment then
    went to the balance (the invoice was paid already). When it leaves the chain, what it
    credited is taken back — not the invoice it did not pay."""
    _, invoice, quote = placed
    assert invoice_settle_manually(invoice=invoice, actor=operator, note=f"LTC quote #{quote.pk}",
                                   now=t0 + timedelta(minutes=1))
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    assert kinds(customer) == [("excess_payment", 6500)] and fresh(invoice).paid_via == "manual"

    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert kinds(customer) == [("excess_payment", 6500), ("clawback", -6500)] and balance(customer) == 0
    assert reversal_audits(invoice) == [{"quote": quote.pk, "taken_cents": 6500}]


def test_forgiving_a_reversal_credits_what_was_taken_back_whatever_the_rate_now(placed, customer, operator, t0):
    """The review of a reversed payment proposes what was taken back; an operator who forgives
    the debt credits exactly that, even when the coin's price has doubled since."""
    _, _, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    review = PaymentReview.objects.get(kind="reversed")
    assert reversal_reviews() == [(p.txid, 6500, 6500, "open")] and int(review.amount) == DUE
    set_rate("LTC", "200", t0 + timedelta(minutes=11))
    payment_review_credit(review=review, actor=operator, now=t0 + timedelta(minutes=12))
    assert kinds(customer) == [("clawback", -6500), ("late_payment", 6500)] and balance(customer) == 0


def test_an_operators_decision_on_a_reversal_review_stands_when_the_payment_returns(
        placed, customer, operator, t0):
    """An operator closed the review without a credit; the payment then comes back on the
    chain: what was taken is given back, and the operator's decision (who, when, why) stays."""
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    review = PaymentReview.objects.get(kind="reversed")
    payment_review_close(review=review, actor=operator, now=t0 + timedelta(minutes=11),
                         note="the customer will pay the invoice again")
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=20))
    assert kinds(customer) == [("clawback", -6500), ("restored", 6500)] and balance(customer) == 0
    review.refresh_from_db()
    assert (review.state, review.decided_by, review.decided_at, review.note) == (
        "closed", operator, t0 + timedelta(minutes=11), "the customer will pay the invoice again")
    assert fresh(invoice).flag == "payment_recovered"


def test_an_overpayment_held_for_an_operator_is_neither_closed_by_a_return_nor_a_forgiven_debt(
        placed, customer, operator, t0, settings):
    """The settlement paid $13.00 over, more than the quote may credit by itself: a review
    holds it. The payment leaves the chain: the over-cap review is closed (nothing to credit);
    it returns: the reversal's review is closed, the over-cap review waits for its operator
    again. Once the operator credits it, a second reversal takes back the invoice's amount and
    the credited excess (the chain holds neither), and the return gives back all that was
    taken: the credit was not a forgiven debt."""
    settings.PAYMENT_AUTO_CREDIT_MAX_PERCENT = 10
    _, _, quote = placed
    p = paid(quote, DUE + 13 * USD, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    over_cap = PaymentReview.objects.get(kind="over_cap")
    assert (over_cap.proposed_cents, over_cap.state, balance(customer)) == (1300, "open", 0)

    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert fresh(over_cap).state == "closed"
    apply(quote, [paid(quote, DUE + 13 * USD, 6, p.txid)], t0 + timedelta(minutes=20))
    assert kinds(customer) == [("clawback", -6500), ("restored", 6500)]
    assert PaymentReview.objects.get(kind="reversed").state == "closed"
    assert PaymentReview.objects.filter(kind="over_cap").count() == 1
    assert fresh(over_cap).state == "open" and fresh(over_cap).decided_at is None

    payment_review_credit(review=over_cap, actor=operator, now=t0 + timedelta(minutes=21))
    assert balance(customer) == 1300
    apply(quote, [], t0 + timedelta(minutes=30), reorged=[(p.txid, 0)])
    assert balance(customer) == -6500
    apply(quote, [paid(quote, DUE + 13 * USD, 6, p.txid)], t0 + timedelta(minutes=40))
    assert kinds(customer)[-2:] == [("clawback", -7800), ("restored", 7800)] and balance(customer) == 1300


def test_a_lease_suspended_for_another_reason_stays_suspended_when_the_debt_is_paid(
        placed, customer, operator, t0):
    """The reversed invoice is recovered once the balance is back at zero, but only a lease
    the reversal suspended resumes: one an operator suspended for its own reason stays so."""
    lease, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    start(lease, t0 + timedelta(minutes=4))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert lease_suspend(lease_id=lease.pk, now=t0 + timedelta(minutes=12), actor=operator,
                         reason="abuse report under investigation", force=True)
    balance_top_up(customer=customer, amount_cents=6500, now=t0 + timedelta(minutes=20))
    run_lifecycle(t0 + timedelta(minutes=21))
    assert fresh(invoice).flag == "payment_recovered" and balance(customer) == 0
    assert fresh(lease).state == LeaseState.SUSPENDED
    assert not LeaseEvent.objects.filter(lease=lease, kind="resumed").exists()



def test_a_reversed_settlement_takes_back_the_whole_invoice_when_an_operator_credited_an_extra_payment(
        placed, customer, operator, t0):
    """As with an extra payment credited automatically (above): the settlement's payment left
    the chain, the invoice's $65.00 is taken back; the $5.00 extra payment, still on the
    chain and credited once (by an operator, no fresh rate when it confirmed), keeps its credit."""
    _, _, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [paid(quote, 5 * USD, 6)], t0 + timedelta(minutes=20))  # the rate is 20 minutes old: held
    set_rate("LTC", "100", t0 + timedelta(minutes=21))
    payment_review_credit(review=PaymentReview.objects.get(kind="no_rate"), actor=operator,
                          now=t0 + timedelta(minutes=22))
    assert kinds(customer) == [("late_payment", 500)]

    apply(quote, [], t0 + timedelta(minutes=25), reorged=[(p.txid, 0)])
    assert kinds(customer) == [("late_payment", 500), ("clawback", -6500)]
    assert balance(customer) == -6000


def test_forgiving_every_review_of_one_reversal_credits_the_debt_once(placed, customer, operator, t0):
    """The settlement's two parts leave the chain in one scan: $65 is taken back once and each
    part gets its review. An operator who forgives both credits $65, not $65 twice; a review
    with nothing left to forgive is refused and stays open for a close with a reason."""
    _, _, quote = placed
    parts = [paid(quote, 40 * USD, 6), paid(quote, 25 * USD, 6)]
    apply(quote, parts, t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0) for p in parts])
    assert kinds(customer) == [("clawback", -6500)]
    first, second = PaymentReview.objects.filter(kind="reversed").order_by("pk")
    payment_review_credit(review=first, actor=operator, now=t0 + timedelta(minutes=11))
    with pytest.raises(PaymentError) as refused:
        payment_review_credit(review=second, actor=operator, now=t0 + timedelta(minutes=12))
    assert str(refused.value) == "Nothing to credit: what this reversal took back is already forgiven."
    assert kinds(customer) == [("clawback", -6500), ("late_payment", 6500)] and balance(customer) == 0
    assert fresh(second).state == PaymentReview.State.OPEN
