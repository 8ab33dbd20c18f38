"""Money on real chains, the same family beyond the first cases: a late payment the customer used to
re-order, then reversed on its chain; an operator forgiving a debt, then the payment coming
back (no second give-back)."""
from datetime import timedelta

from billing.models import LedgerEntry, PaymentReview
from billing.payments.credits import payment_review_credit
from billing.payments.late import late_payment_confirm
from billing.payments.services import sweep_expire_quotes
from ops.lifecycle import run_lifecycle
from rental.agent import Instance
from rental.models import LeaseState
from rental.services import lease_provisioned
from tests.billing.payments_helpers import DUE, apply, balance, fresh, paid, set_rate


def kinds(customer):
    return [(e.kind, e.amount_cents) for e in LedgerEntry.objects.filter(account__customer=customer).order_by("pk")]


def test_a_late_payment_used_to_reorder_then_reversed_suspends_the_new_lease(placed, customer, t0, settings):
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 0
    _, _, quote = placed
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    set_rate("LTC", "100", later)
    p = paid(quote, DUE, 6)
    apply(quote, [p], later + timedelta(minutes=5))
    new_invoice = late_payment_confirm(quote=quote, customer=customer, now=later + timedelta(minutes=6))
    lease_provisioned(lease_id=new_invoice.lease_id, instance=Instance("10.0.0.9", 2209), now=later + timedelta(minutes=7))
    apply(quote, [], later + timedelta(minutes=8), reorged=[(p.txid, 0)])
    assert kinds(customer) == [("late_payment", 6500), ("order", -6500), ("clawback", -6500)]
    assert balance(customer) == -6500 and fresh(new_invoice).flag == "payment_reversed"
    run_lifecycle(later + timedelta(minutes=9))
    assert fresh(new_invoice.lease).state == LeaseState.SUSPENDED


def test_a_debt_forgiven_by_an_operator_is_not_given_back_again_when_the_payment_returns(
        placed, customer, operator, t0):
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert balance(customer) == -6500
    review = PaymentReview.objects.get(kind="reversed")
    payment_review_credit(review=review, actor=operator, now=t0 + timedelta(minutes=11))  # loss accepted
    assert balance(customer) == 0
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=20))  # re-mined after all
    assert balance(customer) == 0  # the debt was forgiven once; the payment pays it, nothing more
    assert kinds(customer) == [("clawback", -6500), ("late_payment", 6500)]
    assert fresh(invoice).flag == "payment_recovered"


def test_a_payment_reorged_and_mined_again_twice_leaves_the_money_where_it_was(placed, customer, t0):
    """Reorg, re-mined, reorg, re-mined: each reversal takes the invoice's amount back, each
    return gives exactly that back (one RESTORED per CLAWBACK, nothing more), and once all
    is given back the reversal's review is closed and the invoice recovered."""
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    assert balance(customer) == 0 and kinds(customer) == []  # the settlement paid the invoice
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    review = PaymentReview.objects.get(kind="reversed")
    assert balance(customer) == -6500 and review.state == "open"
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=20))  # back on the chain
    assert balance(customer) == 0 and kinds(customer) == [("clawback", -6500), ("restored", 6500)]
    review.refresh_from_db()
    assert review.state == "closed" and review.decided_by is None
    run_lifecycle(t0 + timedelta(minutes=21))
    assert fresh(invoice).flag == "payment_recovered"
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=22))  # seen again: nothing posted
    assert len(kinds(customer)) == 2

    apply(quote, [], t0 + timedelta(minutes=30), reorged=[(p.txid, 0)])  # and once more
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=40))
    assert kinds(customer) == [("clawback", -6500), ("restored", 6500)] * 2 and balance(customer) == 0
    assert not PaymentReview.objects.filter(kind="reversed", state="open").exists()
