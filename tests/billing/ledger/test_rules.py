"""The balance's own rules (billing/ledger.py), which the first mutation run of the `ledger` module
found read only through the services above them (session 16): a posting moves the balance and
records what the customer's and the operator's ledger pages show (when, what, how much, the
balance after, the invoice, who, the memo); a repeated idempotency key is a no-op, also within
one batch and also when the balance would no longer cover it; spending below zero is refused with
the balances in the message, except a posting that may go negative (a reversed payment) and a
credit on a negative balance; a batch posts in order with the running balance, raises and posts
nothing, or with refused="skip" leaves out only the postings the balance does not cover, across
several customers in a fixed number of queries; a top-up is positive; cents round up; the payment
window is the setting; the month starts on the 1st at midnight UTC; what is left to refund of an
invoice."""
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.ledger import (
    BillingError,
    InsufficientBalance,
    Posting,
    account_for,
    balance_top_up,
    ceil_div,
    invoice_volume_held_cents,
    invoices_refund_claim,
    ledger_post,
    ledger_post_many,
    month_start,
    payment_window,
    refundable_cents,
)
from billing.models import Account, Invoice, LedgerEntry, OrderedVolume
from tests.factories import order

pytestmark = pytest.mark.django_db
K = LedgerEntry.Kind
PRICE = 6500  # rtx-3090, one week
VOLUME_PART = 327  # 1 TB network volume for a week, ordered with it


def balance(customer) -> int:
    return Account.objects.get(customer=customer).balance_cents


def entries(customer) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(account__customer=customer).order_by("pk"))


def spend(customer, cents, **kwargs) -> Posting:
    return Posting(customer=customer, kind=K.ORDER, amount_cents=-cents, **kwargs)


def a_customer(django_user_model, name):
    return django_user_model.objects.create_user(username=name, password="correct horse battery 9")


# --- one posting ----------------------------------------------------------------------------------

def test_a_posting_records_when_what_how_much_the_balance_after_the_invoice_who_and_why(customer, operator, t0):
    balance_top_up(customer=customer, amount_cents=1000, now=t0)
    invoice = Invoice.objects.create(customer=customer, kind=Invoice.Kind.ORDER, amount_cents=300, created_at=t0)
    later = t0 + timedelta(minutes=5)
    entry = ledger_post(customer=customer, kind=K.ORDER, amount_cents=-300, now=later, invoice=invoice,
                        actor=operator, memo="order #7", idempotency_key=f"pay:{invoice.pk}")
    assert balance(customer) == 700
    stored = LedgerEntry.objects.get(idempotency_key=f"pay:{invoice.pk}")
    assert entry.pk == stored.pk
    assert (stored.account, stored.at, stored.kind, stored.amount_cents, stored.balance_after_cents) == (
        account_for(customer), later, K.ORDER, -300, 700)
    assert (stored.invoice, stored.actor, stored.memo) == (invoice, operator, "order #7")


def test_an_actor_that_is_no_saved_user_is_recorded_as_nobody(customer, t0):
    balance_top_up(customer=customer, amount_cents=500, now=t0, actor=AnonymousUser())
    [entry] = entries(customer)
    assert entry.actor is None and entry.amount_cents == 500 and balance(customer) == 500


def test_a_memo_is_cut_to_the_200_characters_the_ledger_shows(customer, t0):
    memo = "".join(str(n % 10) for n in range(250))
    ledger_post(customer=customer, kind=K.ADJUSTMENT, amount_cents=5, now=t0, memo=memo)
    assert entries(customer)[0].memo == memo[:200]


def test_the_first_posting_of_a_customer_opens_the_account(django_user_model, t0):
    newcomer = a_customer(django_user_model, "newcomer")
    assert not Account.objects.filter(customer=newcomer).exists()
    ledger_post(customer=newcomer, kind=K.SLA_CREDIT, amount_cents=250, now=t0)
    [entry] = entries(newcomer)
    assert balance(newcomer) == 250 and entry.balance_after_cents == 250
    assert (entry.invoice, entry.actor, entry.memo, entry.idempotency_key) == (None, None, "", None)


# --- idempotency ----------------------------------------------------------------------------------

def test_a_repeated_key_is_a_no_op_even_once_the_balance_no_longer_covers_it(customer, t0):
    balance_top_up(customer=customer, amount_cents=500, now=t0)
    first = ledger_post(customer=customer, kind=K.ORDER, amount_cents=-500, now=t0, idempotency_key="order:1")
    assert first is not None and balance(customer) == 0
    assert ledger_post(customer=customer, kind=K.ORDER, amount_cents=-500, now=t0, idempotency_key="order:1") is None
    assert balance(customer) == 0 and len(entries(customer)) == 2


def test_a_key_repeated_within_one_batch_posts_once_and_the_batch_goes_on(customer, t0):
    credit = Posting(customer=customer, kind=K.LATE_PAYMENT, amount_cents=400, idempotency_key="late:9")
    after = Posting(customer=customer, kind=K.REFUND, amount_cents=25, idempotency_key="refund:2")
    first, repeat, then = ledger_post_many([credit, credit, after], now=t0)
    assert first is not None and repeat is None and then.balance_after_cents == 425  # the repeat holds back nothing
    assert balance(customer) == 425 and [e.amount_cents for e in entries(customer)] == [400, 25]


def test_a_repeated_top_up_key_is_a_no_op(customer, t0):
    assert balance_top_up(customer=customer, amount_cents=700, now=t0, idempotency_key="topup:3") is not None
    assert balance_top_up(customer=customer, amount_cents=700, now=t0, idempotency_key="topup:3") is None
    assert balance(customer) == 700
    [entry] = entries(customer)
    assert (entry.kind, entry.actor, entry.memo, entry.invoice) == (K.TOPUP, None, "", None)  # no memo unless given


# --- never below zero -----------------------------------------------------------------------------

def test_spending_the_whole_balance_is_allowed_one_cent_more_is_refused_with_both_amounts(customer, t0):
    balance_top_up(customer=customer, amount_cents=1000, now=t0)
    with pytest.raises(InsufficientBalance) as refused:
        ledger_post(customer=customer, kind=K.ORDER, amount_cents=-1001, now=t0)
    assert str(refused.value) == "Balance $10 does not cover $10.01."
    assert balance(customer) == 1000 and len(entries(customer)) == 1
    entry = ledger_post(customer=customer, kind=K.ORDER, amount_cents=-1000, now=t0)
    assert entry.balance_after_cents == 0 and balance(customer) == 0


def test_a_reversed_payment_may_take_the_balance_below_zero_and_a_credit_on_a_debt_is_accepted(customer, t0):
    balance_top_up(customer=customer, amount_cents=100, now=t0)
    taken = ledger_post(customer=customer, kind=K.CLAWBACK, amount_cents=-300, now=t0, allow_negative=True)
    assert taken.balance_after_cents == -200 and balance(customer) == -200
    back = ledger_post(customer=customer, kind=K.RESTORED, amount_cents=50, now=t0)
    assert back.balance_after_cents == -150 and balance(customer) == -150
    with pytest.raises(InsufficientBalance) as refused:  # a debt buys nothing
        ledger_post(customer=customer, kind=K.ORDER, amount_cents=-1, now=t0)
    assert str(refused.value) == "Balance -$1.50 does not cover $0.01."
    assert balance(customer) == -150


# --- batches --------------------------------------------------------------------------------------

def test_a_batch_posts_in_order_with_the_running_balance(customer, t0):
    balance_top_up(customer=customer, amount_cents=1000, now=t0)
    results = ledger_post_many([spend(customer, 300), spend(customer, 200), spend(customer, 500)], now=t0)
    assert [e.balance_after_cents for e in results] == [700, 500, 0]
    assert balance(customer) == 0 and [e.balance_after_cents for e in entries(customer)] == [1000, 700, 500, 0]


def test_a_batch_that_the_balance_does_not_cover_raises_with_the_running_balance_and_posts_nothing(customer, t0):
    balance_top_up(customer=customer, amount_cents=1000, now=t0)
    with pytest.raises(InsufficientBalance) as refused:
        ledger_post_many([spend(customer, 600), spend(customer, 600)], now=t0)
    assert str(refused.value) == "Balance $4 does not cover $6."
    assert balance(customer) == 1000 and len(entries(customer)) == 1


def test_a_skipping_batch_leaves_out_only_the_postings_the_balance_does_not_cover(customer, t0):
    balance_top_up(customer=customer, amount_cents=1000, now=t0)
    results = ledger_post_many([spend(customer, 600), spend(customer, 600), spend(customer, 300)], now=t0,
                               refused="skip")
    assert [e and e.balance_after_cents for e in results] == [400, None, 100]
    assert balance(customer) == 100 and [e.amount_cents for e in entries(customer)] == [1000, -600, -300]


def test_a_batch_across_customers_keeps_each_balance_apart(customer, other_customer, django_user_model, t0):
    newcomer = a_customer(django_user_model, "newcomer")
    balance_top_up(customer=other_customer, amount_cents=900, now=t0)  # other_customer's account is the older
    balance_top_up(customer=customer, amount_cents=500, now=t0)
    results = ledger_post_many([
        spend(customer, 200), Posting(customer=newcomer, kind=K.SLA_CREDIT, amount_cents=70),
        spend(other_customer, 800), spend(customer, 400), spend(newcomer, 50), spend(other_customer, 50),
    ], now=t0, refused="skip")
    assert [e and (e.account.customer, e.balance_after_cents) for e in results] == [
        (customer, 300), (newcomer, 70), (other_customer, 100), None, (newcomer, 20), (other_customer, 50)]
    assert (balance(customer), balance(other_customer), balance(newcomer)) == (300, 50, 20)


def test_a_batch_of_one_customers_postings_moves_the_balance_by_their_sum(customer, t0):
    balance_top_up(customer=customer, amount_cents=1000, now=t0)
    ledger_post_many([spend(customer, 100), Posting(customer=customer, kind=K.REFUND, amount_cents=30)], now=t0)
    assert balance(customer) == 930


def test_an_empty_batch_posts_nothing():
    assert ledger_post_many([], now=datetime(2026, 12, 4, tzinfo=UTC)) == []


def test_a_batch_is_a_fixed_few_statements_whatever_its_customers(django_user_model, t0):
    """The accounts are locked in one query once they exist, the repeated keys read in one (only
    when a posting has a key), then one UPDATE of the balances and one INSERT of the entries (a
    lifecycle batch's renewals)."""
    people = [a_customer(django_user_model, f"c{n}") for n in range(4)]
    for person in people:
        balance_top_up(customer=person, amount_cents=1000, now=t0)

    def statements(postings) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            ledger_post_many(postings, now=t0)
        return [q["sql"].split()[0] for q in captured.captured_queries
                if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]

    assert statements([spend(c, 10) for c in people[:2]]) == ["SELECT", "UPDATE", "INSERT"]
    assert statements([spend(c, 10) for c in people]) == ["SELECT", "UPDATE", "INSERT"]
    assert statements([spend(c, 10, idempotency_key=f"k{n}") for n, c in enumerate(people)]) == [
        "SELECT", "SELECT", "UPDATE", "INSERT"]
    assert [balance(p) for p in people] == [970, 970, 980, 980]


# --- top-ups, rounding, the payment window, the month ---------------------------------------------

@pytest.mark.parametrize("cents", [0, -100])
def test_a_top_up_must_be_positive(customer, t0, cents):
    with pytest.raises(BillingError) as refused:
        balance_top_up(customer=customer, amount_cents=cents, now=t0)
    assert str(refused.value) == "A top-up must be a positive amount."
    assert not LedgerEntry.objects.exists()


def test_a_top_up_of_one_cent_is_a_top_up_entry_with_its_actor_and_memo(customer, operator, t0):
    entry = balance_top_up(customer=customer, amount_cents=1, now=t0, actor=operator, memo="bank transfer",
                           idempotency_key="topup:1")
    stored = LedgerEntry.objects.get(pk=entry.pk)
    assert (stored.kind, stored.amount_cents, stored.at, stored.actor, stored.memo, stored.idempotency_key) == (
        K.TOPUP, 1, t0, operator, "bank transfer", "topup:1")
    assert balance(customer) == 1


@pytest.mark.parametrize(("a", "b", "cents"), [(7, 2, 4), (6, 2, 3), (1, 100, 1), (0, 30, 0), (200, 100, 2)])
def test_cents_are_rounded_up(a, b, cents):
    assert ceil_div(a, b) == cents


def test_the_payment_window_is_the_setting(settings):
    settings.PAYMENT_WINDOW_MINUTES = 45
    assert payment_window() == timedelta(minutes=45)


def test_the_month_starts_on_the_first_at_midnight_utc(customer):
    assert month_start(datetime(2026, 12, 4, 15, 10, 14, 123456, tzinfo=UTC)) == datetime(2026, 12, 1, tzinfo=UTC)
    assert month_start(datetime(2026, 12, 1, 0, 0, tzinfo=UTC)) == datetime(2026, 12, 1, tzinfo=UTC)


def test_an_account_is_opened_once_with_a_zero_balance(customer):
    account = account_for(customer)
    assert account.balance_cents == 0 and account_for(customer).pk == account.pk
    assert Account.objects.filter(customer=customer).count() == 1


# --- what is left to refund of an invoice ---------------------------------------------------------

def test_what_is_left_to_refund_is_the_paid_orders_amount_less_refunds_and_its_own_volume_while_held(
        catalog, customer, t0):
    balance_top_up(customer=customer, amount_cents=2 * (PRICE + VOLUME_PART), now=t0)
    (first, first_invoice), (second, second_invoice) = (
        order(customer, t0, addons={"network_volume_tb": 1}) for _ in range(2))
    first_invoice.refresh_from_db(), second_invoice.refresh_from_db()
    assert first_invoice.amount_cents == second_invoice.amount_cents == PRICE + VOLUME_PART
    assert invoice_volume_held_cents(first_invoice) == VOLUME_PART  # its own volume, not both
    assert refundable_cents(first_invoice) == PRICE  # being created: held

    OrderedVolume.objects.filter(lease=first).update(state=OrderedVolume.State.CREATED)
    assert invoice_volume_held_cents(first_invoice) == VOLUME_PART and refundable_cents(first_invoice) == PRICE

    # the storage could not create the second's volume: its part went back, the rest is refundable
    OrderedVolume.objects.filter(lease=second).update(state=OrderedVolume.State.REFUNDED)
    Invoice.objects.filter(pk=second_invoice.pk).update(refunded_cents=VOLUME_PART)
    second_invoice.refresh_from_db()
    assert invoice_volume_held_cents(second_invoice) == 0 and refundable_cents(second_invoice) == PRICE

    Invoice.objects.filter(pk=first_invoice.pk).update(refunded_cents=PRICE + 1)  # an operator gave back more
    first_invoice.refresh_from_db()
    assert refundable_cents(first_invoice) == 0


def test_an_unpaid_order_and_a_paid_top_up_have_nothing_to_refund(catalog, customer, t0):
    _lease, unpaid = order(customer, t0, pay=False)
    assert unpaid.state == Invoice.State.OPEN and refundable_cents(unpaid) == 0
    top_up = Invoice.objects.create(customer=customer, kind=Invoice.Kind.TOPUP, state=Invoice.State.PAID,
                                    amount_cents=5000, created_at=t0, paid_at=t0)
    assert refundable_cents(top_up) == 0


def test_a_claim_takes_at_most_the_cents_asked_in_invoice_order_and_records_them(customer, t0):
    first, second = (Invoice.objects.create(customer=customer, kind=Invoice.Kind.ORDER, state=Invoice.State.PAID,
                                            amount_cents=cents, created_at=t0, paid_at=t0) for cents in (1000, 2000))
    later = t0 + timedelta(minutes=3)
    assert invoices_refund_claim(invoices=[second, first], now=t0, cents=300) == (300, [first])
    taken, touched = invoices_refund_claim(invoices=[second, first], now=later, cents=1500)
    assert (taken, touched) == (1500, [first, second])
    assert [i.refunded_cents for i in touched] == [1000, 800]
    assert [(i.refunded_cents, i.refunded_at) for i in Invoice.objects.filter(customer=customer).order_by("pk")] == [
        (1000, later), (800, later)]
    taken, touched = invoices_refund_claim(invoices=[first, second], now=later)  # all that is left
    assert (taken, touched, touched[0].refunded_cents) == (1200, [second], 2000)
    assert invoices_refund_claim(invoices=[first, second], now=later) == (0, [])
