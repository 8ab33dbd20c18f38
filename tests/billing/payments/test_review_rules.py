"""Payment reviews: money held for an operator is opened once with an audit
row, and an operator's decision — credit or close — is exact: the proposed amount (or the
coins at today's fresh rate when there was none), never a sub-cent posting, on the ledger
line of the invoice with the operator named, the payment's record and the customer's page
telling the same, and a decided review never decided twice."""
from datetime import timedelta
from decimal import Decimal

import pytest

from billing.models import LedgerEntry, Payment, PaymentReview
from billing.payments.credits import payment_review_close, payment_review_credit
from billing.payments.pricing import PaymentError
from billing.payments.selectors import payment_lines
from billing.payments.services import sweep_expire_quotes
from inventory.models import AuditEntry
from ops.lifecycle import run_lifecycle
from tests.billing.payments_helpers import DUE, USD, apply, balance, fresh, paid, set_rate

R = PaymentReview
CENT = USD // 100  # litoshi worth one cent at $100/LTC


def expire(quote, at):
    run_lifecycle(at)
    sweep_expire_quotes(at)
    return fresh(quote)


def late_without_a_rate(quote, t0, *amounts):
    """The quote expired; payments confirm 3 h later, when the $100 rate is stale: each waits
    for an operator (a NO_RATE review). Returns the time they confirmed."""
    later = t0 + timedelta(hours=3)
    expire(quote, t0 + timedelta(minutes=31))
    apply(quote, [paid(quote, amount, 6) for amount in amounts], later)
    return later


def held_over_the_cap(quote, t0, settings):
    """$32.50 credited on its own at $50/LTC (within 150 % of the $65 quote), then a thousand
    times the amount sent: $32,500 held. Returns the review and the time."""
    settings.PAYMENT_AUTO_CREDIT_MAX_PERCENT = 150
    later = t0 + timedelta(days=6)
    expire(quote, t0 + timedelta(minutes=31))
    set_rate("LTC", "50", later)
    apply(quote, [paid(quote, DUE, 6)], later)
    apply(quote, [paid(quote, 1000 * DUE, 6)], later)
    return PaymentReview.objects.get(), later


def audit_of(review, action):
    return AuditEntry.objects.get(action=action, object_type="billing.PaymentReview", object_id=str(review.pk))


@pytest.mark.django_db
def test_money_held_for_an_operator_opens_one_review_with_an_audit_row(placed, t0):
    """The review says what is held (base units, no proposal without a rate), takes nothing
    back (that is a reversal's), and the audit row records it for the system (no actor)."""
    _, _, quote = placed
    later = late_without_a_rate(quote, t0, DUE)
    review = PaymentReview.objects.get()
    assert (review.kind, review.state, int(review.amount), review.proposed_cents, review.clawed_back_cents,
            review.created_at) == (R.Kind.NO_RATE, R.State.OPEN, DUE, None, 0, later)
    entry = audit_of(review, "payment_review_open")
    assert entry.actor is None
    assert entry.detail == {"kind": "no_rate", "quote": quote.pk, "amount": "65000000", "proposed_cents": None}
    apply(quote, [paid(quote, DUE, 7, Payment.objects.get().txid)], later + timedelta(minutes=1))  # next pass
    assert AuditEntry.objects.filter(action="payment_review_open").count() == 1


@pytest.mark.django_db
def test_an_operator_credits_an_unpriced_late_payment_at_todays_rate_on_the_record(placed, customer, operator, t0):
    """$65 of LTC with no fresh rate when it confirmed, credited by an operator once the rate
    is $80: $52.00 on the balance, on a ledger line of the quote's invoice naming the operator,
    the payment credited at $80, the customer told so, the decision dated and audited."""
    _, invoice, quote = placed
    later = late_without_a_rate(quote, t0, DUE)
    review = PaymentReview.objects.get()
    decided = later + timedelta(minutes=20)
    set_rate("LTC", "80", decided)
    review = payment_review_credit(review=review, actor=operator, now=decided)

    assert balance(customer) == 5200
    entry = LedgerEntry.objects.get(kind=LedgerEntry.Kind.LATE_PAYMENT)
    assert (entry.amount_cents, entry.at, entry.invoice, entry.actor) == (5200, decided, invoice, operator)
    assert entry.memo == f"paid late, no fresh rate: quote #{quote.pk}, credited by an operator"
    p = Payment.objects.get()
    assert (p.credited_cents, p.credit_rate) == (5200, Decimal("80"))
    assert [line.outcome for line in payment_lines(quote)] == [
        "credited $52.00 to your balance at $80 per LTC when it confirmed"]

    review = fresh(review)
    assert (review.state, review.decided_at, review.decided_by, review.note) == (
        R.State.CREDITED, decided, operator, "credited 5200 cents")
    audit = audit_of(review, "payment_review_credited")
    assert audit.actor == operator
    assert audit.detail == {"kind": "no_rate", "quote": quote.pk, "note": "credited 5200 cents", "cents": 5200}


@pytest.mark.django_db
def test_an_operator_credits_a_payment_over_the_cap_at_the_amount_proposed_not_todays_rate(
        placed, customer, operator, t0, settings):
    """The review proposed $32,500 (the rate when it confirmed); the coin quadrupled since:
    the credit is still what was proposed, and the payment records it."""
    _, _, quote = placed
    review, later = held_over_the_cap(quote, t0, settings)
    assert (review.kind, review.proposed_cents) == (R.Kind.OVER_CAP, 3_250_000)
    set_rate("LTC", "200", later + timedelta(hours=1))
    payment_review_credit(review=review, actor=operator, now=later + timedelta(hours=1))
    assert balance(customer) == 3250 + 3_250_000
    assert Payment.objects.get(amount=1000 * DUE).credited_cents == 3_250_000
    assert fresh(review).state == R.State.CREDITED


@pytest.mark.django_db
def test_a_review_worth_one_cent_is_credited_one_worth_less_is_refused(placed, customer, operator, t0):
    """Today's rate rounds down: 10,000 litoshi at $100/LTC is one cent, credited; 9,999 is
    worth nothing, refused with a message and left open for the operator to close."""
    _, _, quote = placed
    later = late_without_a_rate(quote, t0, CENT, CENT - 1)
    one_cent = PaymentReview.objects.get(amount=CENT)
    less = PaymentReview.objects.get(amount=CENT - 1)
    set_rate("LTC", "100", later)

    with pytest.raises(PaymentError) as refused:
        payment_review_credit(review=less, actor=operator, now=later)
    assert str(refused.value) == "Nothing to credit: the amount is worth less than a cent."
    assert fresh(less).state == R.State.OPEN and balance(customer) == 0

    payment_review_credit(review=one_cent, actor=operator, now=later)
    assert balance(customer) == 1 and fresh(one_cent).state == R.State.CREDITED
    assert Payment.objects.get(amount=CENT).credited_cents == 1


@pytest.mark.django_db
def test_an_operator_closes_a_review_with_a_reason_and_it_is_decided_once(placed, customer, operator, t0, settings):
    """Closing needs a reason (kept on the review, trimmed, and in the audit row); once
    decided, neither a credit nor a second close is taken, with the message the admin shows."""
    _, _, quote = placed
    review, later = held_over_the_cap(quote, t0, settings)
    with pytest.raises(PaymentError) as no_reason:
        payment_review_close(review=review, actor=operator, now=later, note="   ")
    assert str(no_reason.value) == "Say why the review is closed without a credit."
    assert fresh(review).state == R.State.OPEN

    closed = later + timedelta(minutes=30)
    review = payment_review_close(review=review, actor=operator, now=closed, note="  refunded on-chain, tx abc\n")
    assert (review.state, review.decided_at, review.decided_by, review.note) == (
        R.State.CLOSED, closed, operator, "refunded on-chain, tx abc")
    audit = audit_of(review, "payment_review_closed")
    assert audit.actor == operator
    assert audit.detail == {"kind": "over_cap", "quote": quote.pk, "note": "refunded on-chain, tx abc", "cents": None}

    for decide in (lambda: payment_review_credit(review=review, actor=operator, now=closed),
                   lambda: payment_review_close(review=review, actor=operator, now=closed, note="again")):
        with pytest.raises(PaymentError) as again:
            decide()
        assert str(again.value) == "This review is already decided."
    assert balance(customer) == 3250 and fresh(review).note == "refunded on-chain, tx abc"


@pytest.mark.django_db
def test_forgiving_a_reversed_payment_does_not_make_it_a_credit_of_its_own(placed, customer, operator, t0):
    """The payment paid the invoice, left the chain (taken back), the operator accepted the
    loss: the payment is still the one that paid the invoice, not a balance credit — and when
    it is mined again the customer reads exactly that."""
    _, _, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    review = PaymentReview.objects.get(kind=R.Kind.REVERSED)
    payment_review_credit(review=review, actor=operator, now=t0 + timedelta(minutes=11))
    assert balance(customer) == 0
    payment = Payment.objects.get()
    assert (payment.in_settlement, payment.credited_cents, payment.credit_rate) == (True, None, None)
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=20))  # re-mined after all
    assert [line.outcome for line in payment_lines(fresh(quote))] == ["paid the invoice"]


@pytest.mark.django_db
def test_the_customer_sees_a_payment_credited_by_an_operator_over_the_cap(
        placed, customer, operator, client, t0, settings):
    """Payment.credit_rate is "USD per coin it was credited at": the $32,500 proposed at $50/LTC
    is credited by an operator, and the customer's page of the quote says so."""
    _, _, quote = placed
    review, later = held_over_the_cap(quote, t0, settings)
    payment_review_credit(review=review, actor=operator, now=later)
    assert Payment.objects.get(amount=1000 * DUE).credit_rate == Decimal("50")
    client.force_login(customer)
    page = client.get(f"/pay/quote/{quote.pk}/").content.decode()
    assert "credited $32,500.00 to your balance" in page
