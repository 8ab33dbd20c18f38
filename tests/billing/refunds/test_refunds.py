"""One refundable amount per invoice, whichever path refunds it — the customer's
"Cancel and refund" within the refund window, the operator's refund from the customer desk
(all or part), a lease that failed to provision — in either order, and racing on two
PostgreSQL connections. ($55 paid must never be $110 back.)"""
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice, LedgerEntry
from billing.refunds import lease_refund, refunds_left
from billing.services import BillingError, account_for, balance_top_up, refundable_cents
from ops.backoffice.services import invoice_refund_to_balance
from rental.models import LeaseState
from tests.billing.payments_helpers import fresh
from tests.billing.races import in_threads, postgres_only
from tests.factories import order

PRICE = 6500  # rtx-3090, one week


def refunds(customer) -> list[int]:
    return list(LedgerEntry.objects.filter(account__customer=customer, kind="refund").order_by("pk")
                .values_list("amount_cents", flat=True))


def balance(customer) -> int:
    return account_for(customer).balance_cents


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def paid_order(catalog, customer):
    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=10_000, now=now)
    lease, invoice = order(customer, now)  # paid from the balance: 100 - 65
    assert balance(customer) == 3500 and fresh(invoice).state == Invoice.State.PAID
    return lease, invoice


def desk_refund(op_client, customer, invoice, amount=""):
    return op_client.post(reverse("admin:ops_customer", args=[customer.pk]), {
        "action": "refund", "refund-invoice": str(invoice.pk), "refund-amount": amount,
        "refund-reason": "goodwill", "refund-lease_keeps_running": "on"}, follow=True)  # the desk's warning, confirmed


def test_operator_refund_then_customer_cancel_and_refund_pays_back_once(
        paid_order, customer, op_client, client, django_user_model):
    lease, invoice = paid_order
    desk_refund(op_client, customer, invoice)
    assert refunds(customer) == [PRICE] and balance(customer) == 10_000
    shopper = client.__class__()
    shopper.force_login(customer)
    page = shopper.post(reverse("billing:lease_refund", args=[lease.pk]), follow=True)
    assert page.status_code == 200
    assert refunds(customer) == [PRICE] and balance(customer) == 10_000  # not $130 back
    assert fresh(lease).state == LeaseState.CANCELLED  # cancelled all the same
    assert fresh(invoice).refunded_cents == PRICE and refundable_cents(fresh(invoice)) == 0
    assert refunds_left(customer) == 1  # refunding nothing used none of the month's refunds


def test_customer_refund_then_operator_refund_is_refused(paid_order, customer, op_client):
    lease, invoice = paid_order
    assert lease_refund(lease=lease, actor=customer) == PRICE
    page = desk_refund(op_client, customer, invoice)
    assert "already refunded" in page.content.decode()
    assert refunds(customer) == [PRICE] and balance(customer) == 10_000


def test_a_partial_desk_refund_leaves_only_the_rest_to_the_customer(paid_order, customer, op_client):
    lease, invoice = paid_order
    desk_refund(op_client, customer, invoice, amount="20.00")
    assert fresh(invoice).refunded_cents == 2000
    desk_refund(op_client, customer, invoice, amount="50.00")  # more than is left: what is left
    assert refunds(customer) == [2000, 4500] and fresh(invoice).refunded_cents == PRICE
    assert lease_refund(lease=lease, actor=customer) == 0
    assert balance(customer) == 10_000


def test_a_failed_provisioning_refunds_only_what_the_operator_did_not(paid_order, customer, operator, settings):
    from ops.lifecycle import sweep_provisioning_deadline

    lease, invoice = paid_order
    invoice_refund_to_balance(invoice=invoice, actor=operator, reason="goodwill", now=timezone.now(), cents=1500)
    later = timezone.now() + settings.NODE_PROVISIONING_DEADLINE + timedelta(minutes=1)
    assert len(sweep_provisioning_deadline(later)) == 1
    assert refunds(customer) == [1500, 5000] and balance(customer) == 10_000
    with pytest.raises(BillingError, match="already refunded"):
        invoice_refund_to_balance(invoice=invoice, actor=operator, reason="again", now=later)


def test_the_database_refuses_refunding_more_than_the_invoice(paid_order):
    _, invoice = paid_order
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.filter(pk=invoice.pk).update(refunded_cents=PRICE + 1)


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_operator_and_customer_refunding_at_the_same_moment_pay_back_once(catalog, customer, operator, settings):
    settings.REFUNDS_PER_MONTH = 10
    for _ in range(3):
        now = timezone.now()
        balance_top_up(customer=customer, amount_cents=PRICE, now=now)
        lease, invoice = order(customer, now)
        before = balance(customer)
        results = in_threads(
            lambda lease=lease: lease_refund(lease=lease, actor=customer),
            lambda invoice=invoice: invoice_refund_to_balance(invoice=invoice, actor=operator, reason="race",
                                                              now=timezone.now()))
        assert not [r for r in results if isinstance(r, BaseException) and not isinstance(r, BillingError)], results
        assert balance(customer) - before == PRICE  # once, whoever won
        assert fresh(invoice).refunded_cents == PRICE


# --- the network volume ordered with the lease (one rule: refundable_cents) ---------------------

VOLUME_PART = 327  # 1 TB × ceil($14 × 7/30), the order invoice's volume line


def _volume_order(customer, settle):
    """An RTX 3090 week with a 1 TB network volume, paid from the balance (simulated storage);
    `settle` creates the volume ("created") or finds the storage down ("down")."""
    from billing.models import OrderedVolume
    from storage import orders
    from storage.volumes import StorageUnavailable

    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=PRICE + VOLUME_PART, now=now)
    lease, invoice = order(customer, now, addons={"network_volume_tb": 1})
    assert fresh(invoice).amount_cents == PRICE + VOLUME_PART and balance(customer) == 0
    row = OrderedVolume.objects.get(lease=lease)
    if settle == "down":
        def down(**kwargs):
            raise StorageUnavailable("the storage at DFW-1 is not answering")
        real, orders.volume_provision = orders.volume_provision, down
        try:
            assert orders.ordered_volume_settle(row=row, now=now) == "refunded"
        finally:
            orders.volume_provision = real
    else:
        assert orders.ordered_volume_settle(row=row, now=now) == "created"
    return lease, fresh(invoice), OrderedVolume.objects.get(pk=row.pk)


def test_desk_refund_holds_back_a_created_network_volume(catalog, customer, op_client):
    from rental.models import NetworkVolume

    lease, invoice, row = _volume_order(customer, "created")
    assert refundable_cents(invoice) == PRICE
    page = desk_refund(op_client, customer, invoice)
    assert page.status_code == 200
    assert refunds(customer) == [PRICE] and balance(customer) == PRICE   # the instance part only
    assert fresh(invoice).refunded_cents == PRICE and refundable_cents(fresh(invoice)) == 0
    assert NetworkVolume.objects.get(pk=row.volume_id).state == "active"  # the customer's, paid for its week
    again = desk_refund(op_client, customer, invoice).content.decode()   # nothing more, with the reason
    assert "paid for the network volume ordered with the lease" in again and refunds(customer) == [PRICE]
    # the customer's own refund agrees: nothing left, the volume part is never returned
    assert lease_refund(lease=lease, actor=customer) == 0 and balance(customer) == PRICE


def test_desk_refund_of_an_order_whose_volume_was_not_created_refunds_all(catalog, customer, operator):
    _lease, invoice, row = _volume_order(customer, "down")
    assert row.state == "refunded" and row.volume_id is None
    assert refunds(customer) == [VOLUME_PART]                              # the add-on, back at once
    invoice_refund_to_balance(invoice=invoice, actor=operator, reason="goodwill", now=timezone.now())
    assert refunds(customer) == [VOLUME_PART, PRICE] and balance(customer) == PRICE + VOLUME_PART
    assert fresh(invoice).refunded_cents == invoice.amount_cents


def test_desk_refund_while_the_volume_is_being_created_leaves_its_part_to_the_add_on(catalog, customer, operator):
    """Pending: the volume may still be created, so the desk does not return its part; if it
    then cannot be created, the add-on path refunds that part (once, never twice)."""
    from billing.models import OrderedVolume
    from storage.orders import ordered_volume_refund

    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=PRICE + VOLUME_PART, now=now)
    lease, invoice = order(customer, now, addons={"network_volume_tb": 1})
    row = OrderedVolume.objects.get(lease=lease)
    assert row.state == "pending"
    invoice_refund_to_balance(invoice=invoice, actor=operator, reason="goodwill", now=now)
    assert refunds(customer) == [PRICE]
    ordered_volume_refund(row=row, now=now, reason="storage down")
    assert refunds(customer) == [PRICE, VOLUME_PART] and fresh(invoice).refunded_cents == PRICE + VOLUME_PART


def test_only_paid_orders_and_renewals_are_refundable(catalog, customer):
    """refundable_cents: a paid order's amount less what was refunded of it; nothing of an
    unpaid invoice, nothing of a top-up (that money is the balance itself)."""
    from billing.services import topup_invoice_create

    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=PRICE, now=now)
    _, paid = order(customer, now)
    _, unpaid = order(customer, now, pay=False)
    topup = topup_invoice_create(customer=customer, amount_cents=5000, now=now)
    Invoice.objects.filter(pk=topup.pk).update(state=Invoice.State.PAID)
    assert [refundable_cents(fresh(i)) for i in (paid, unpaid, topup)] == [PRICE, 0, 0]


def test_a_refund_of_at_most_some_cents_takes_the_invoices_in_order(catalog, customer):
    """invoices_refund_claim with a ceiling: the first invoice all of it, the next only what
    is left of the ceiling ($100 over two $65 orders: $65 + $35)."""
    from billing.ledger import invoices_refund_claim

    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=2 * PRICE, now=now)
    first, second = order(customer, now)[1], order(customer, now)[1]
    taken, touched = invoices_refund_claim(invoices=[first, second], now=now, cents=10_000)
    assert (taken, [i.pk for i in touched]) == (10_000, [first.pk, second.pk])
    assert (fresh(first).refunded_cents, fresh(second).refunded_cents) == (PRICE, 10_000 - PRICE)


# --- which invoices a refund touches ---------------------------------------------


def test_a_lease_refund_touches_only_the_invoices_with_something_left(catalog, customer, operator, t0):
    """Ordered, extended by a week (a paid renewal), then the desk refunded the order: the
    customer's "Cancel and refund" returns the renewal. Only the renewal is refunded now —
    its refunded time is the refund's, the ledger entry and the audit name it — and the
    order keeps the desk's refund time: nothing of it was left to touch."""
    from billing.renewals import lease_extend_order
    from inventory.models import AuditEntry
    from tests.automation.helpers import active_lease

    lease = active_lease(customer, t0)
    order_invoice = Invoice.objects.get(lease=lease, kind=Invoice.Kind.ORDER)
    renewal = lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=t0 + timedelta(minutes=10))
    assert renewal.state == Invoice.State.PAID
    desk_at, refund_at = t0 + timedelta(minutes=15), t0 + timedelta(minutes=20)
    invoice_refund_to_balance(invoice=order_invoice, actor=operator, reason="goodwill", now=desk_at)

    assert lease_refund(lease=lease, actor=customer, now=refund_at) == PRICE
    order_invoice, renewal = fresh(order_invoice), fresh(renewal)
    assert (order_invoice.refunded_cents, order_invoice.refunded_at) == (PRICE, desk_at)
    assert (renewal.refunded_cents, renewal.refunded_at) == (PRICE, refund_at)
    entry = LedgerEntry.objects.get(account__customer=customer, kind="refund", actor=customer)
    assert (entry.amount_cents, entry.invoice_id, entry.at) == (PRICE, renewal.pk, refund_at)
    audit = AuditEntry.objects.get(action="lease_refund", object_id=str(lease.pk))
    assert audit.detail["invoices"] == [renewal.pk]


def test_the_last_cent_left_of_an_invoice_is_refunded_too(paid_order, customer, operator):
    """The desk returned all but one cent of the order: the customer's refund returns that cent."""
    lease, invoice = paid_order
    invoice_refund_to_balance(invoice=invoice, actor=operator, reason="goodwill", now=timezone.now(), cents=PRICE - 1)
    assert lease_refund(lease=lease, actor=customer) == 1
    assert refunds(customer) == [PRICE - 1, 1] and fresh(invoice).refunded_cents == PRICE
    assert balance(customer) == 10_000

