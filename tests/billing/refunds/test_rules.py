"""The refund rules the first mutation run of billing/services.py found untested (session 13):
who may refund a lease and what each refusal says; what counts against the customer's
REFUNDS_PER_MONTH (only the customer's own refunds of money, whoever else holds an account;
a network volume add-on still being created is money too; cancelling an unpaid order and
operators' refunds are not); what a refund leaves behind (the lease's open invoices voided and
no one else's, the ledger row, the lease event and the audit row with who and how long the
instance ran); and a lease that fails to provision — only its own invoices refunded, a pending
volume add-on cancelled, the refund row, the lease event, the notice in the customer's
language, what is still open for the lease voided and nothing else."""
from datetime import timedelta

import pytest
from django.conf import settings as django_settings

from billing.models import Invoice, LedgerEntry
from billing.refunds import lease_fail_and_refund, lease_refund, refunds_left
from billing.services import (
    BillingError,
    RefundLimitReached,
    account_for,
    balance_top_up,
    topup_invoice_create,
)
from core.money import format_usd
from inventory.models import AuditEntry
from ops.backoffice.services import invoice_refund_to_balance
from rental.models import CustomerSettings, LeaseEvent, LeaseState, Notification
from storage.models import OrderedVolume
from tests.billing.payments_helpers import fresh
from tests.factories import order

PRICE = 6500  # rtx-3090, one week
VOLUME_PART = 327  # 1 TB network volume for a week: ceil($14 × 7/30)
ADDON = {"network_volume_tb": 1}


def paid(customer, t0, addons=None):
    """A paid order (from a balance topped up by exactly its price), still provisioning."""
    balance_top_up(customer=customer, amount_cents=PRICE + (VOLUME_PART if addons else 0), now=t0)
    lease, invoice = order(customer, t0, addons=addons)
    assert fresh(lease).state == LeaseState.PROVISIONING
    return lease, fresh(invoice)


def balance(customer) -> int:
    return account_for(customer).balance_cents


def refund_rows(customer) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.REFUND).order_by("pk"))


def use_the_months_refund(customer, t0):
    for _each in range(refunds_left(customer, t0)):
        lease, _ = paid(customer, t0)
        assert lease_refund(lease=lease, actor=customer, now=t0) == PRICE
    assert refunds_left(customer, t0) == 0


def past_the_deadline(t0):
    return t0 + django_settings.NODE_PROVISIONING_DEADLINE + timedelta(minutes=1)


# --- who may refund, and what each refusal says -------------------------------------------------

def test_only_the_customer_or_an_operator_may_refund_a_lease(catalog, customer, other_customer, t0):
    lease, invoice = paid(customer, t0)
    with pytest.raises(BillingError) as refused:
        lease_refund(lease=lease, actor=other_customer, now=t0)
    assert str(refused.value) == "Only the lease's customer or an operator can refund it."
    assert fresh(lease).state == LeaseState.PROVISIONING and fresh(invoice).refunded_cents == 0
    assert refund_rows(customer) == [] and balance(customer) == 0


def test_a_refund_at_the_end_of_the_window_is_refused_naming_the_window(catalog, customer, t0, settings):
    lease, invoice = paid(customer, t0)
    with pytest.raises(BillingError) as refused:
        lease_refund(lease=lease, actor=customer, now=fresh(lease).refund_until)
    assert str(refused.value) == (f"Refunds are possible within {settings.LEASE_REFUND_WINDOW_MINUTES} minutes of "
                                  "ordering; this lease is older.")
    assert fresh(lease).state == LeaseState.PROVISIONING and fresh(invoice).refunded_cents == 0


def test_a_lease_that_already_ended_cannot_be_refunded_and_the_refusal_names_its_state(catalog, customer, t0):
    lease, _ = order(customer, t0, pay=False)
    assert lease_refund(lease=lease, actor=customer, now=t0) == 0  # an unpaid order: cancelled
    with pytest.raises(BillingError) as refused:
        lease_refund(lease=lease, actor=customer, now=t0 + timedelta(minutes=1))
    assert str(refused.value) == "A lease that is cancelled cannot be refunded."


def test_the_refund_limit_refusal_says_how_many_refunds_a_month_and_whom_to_ask(catalog, customer, t0, settings):
    use_the_months_refund(customer, t0)
    second, _ = paid(customer, t0)
    with pytest.raises(RefundLimitReached) as refused:
        lease_refund(lease=second, actor=customer, now=t0)
    assert str(refused.value) == (f"You have used your {settings.REFUNDS_PER_MONTH} no-questions refund(s) this "
                                  "month; contact support instead.")


# --- what counts against REFUNDS_PER_MONTH -------------------------------------------------------

def test_an_operator_refunding_a_customers_lease_keeps_the_operators_own_allowance(catalog, customer, operator, t0):
    account_for(operator)  # the operator shops here too
    lease, _ = paid(customer, t0)
    assert lease_refund(lease=lease, actor=operator, now=t0) == PRICE
    assert refunds_left(operator, t0) == django_settings.REFUNDS_PER_MONTH
    assert refunds_left(customer, t0) == django_settings.REFUNDS_PER_MONTH


def test_cancelling_an_unpaid_order_is_possible_after_the_months_refund_is_used(catalog, customer, t0):
    use_the_months_refund(customer, t0)
    unpaid, invoice = order(customer, t0, pay=False)
    assert lease_refund(lease=unpaid, actor=customer, now=t0) == 0
    assert fresh(unpaid).state == LeaseState.CANCELLED and fresh(invoice).state == Invoice.State.VOID


def test_an_operator_can_refund_a_customer_who_used_the_months_refund(catalog, customer, operator, t0):
    use_the_months_refund(customer, t0)
    lease, invoice = paid(customer, t0)
    before = balance(customer)
    assert lease_refund(lease=lease, actor=operator, now=t0) == PRICE
    assert balance(customer) == before + PRICE and fresh(invoice).refunded_cents == PRICE
    assert fresh(lease).state == LeaseState.CANCELLED


@pytest.mark.parametrize("instance_part_left", [0, VOLUME_PART])
def test_a_pending_volume_addon_counts_as_money_against_the_months_refunds(
        catalog, customer, operator, t0, instance_part_left):
    """The operator already refunded the instance part (all of it, or all but as much as the
    add-on costs): what the customer's refund would return is still money, so it is refused
    once the month's refund is used, and the add-on is not cancelled."""
    use_the_months_refund(customer, t0)
    lease, invoice = paid(customer, t0, addons=ADDON)
    row = OrderedVolume.objects.get(lease=lease)
    assert row.state == "pending" and row.cents == VOLUME_PART
    invoice_refund_to_balance(invoice=invoice, actor=operator, reason="goodwill", now=t0,
                              cents=PRICE - instance_part_left)
    before = balance(customer)
    with pytest.raises(RefundLimitReached):
        lease_refund(lease=lease, actor=customer, now=t0)
    assert balance(customer) == before
    assert OrderedVolume.objects.get(pk=row.pk).state == "pending"
    assert fresh(lease).state == LeaseState.PROVISIONING
    assert fresh(invoice).refunded_cents == PRICE - instance_part_left


def test_a_customers_refund_of_only_the_pending_volume_is_one_refund_of_the_month(catalog, customer, operator, t0):
    """The operator refunded the instance part; the customer's "Cancel and refund" then returns
    the add-on's part alone. That is money back, on the customer's word: it is told, audited
    with its amount and counted against the month's refunds like any other."""
    lease, invoice = paid(customer, t0, addons=ADDON)
    invoice_refund_to_balance(invoice=invoice, actor=operator, reason="goodwill", now=t0, cents=PRICE)
    before = balance(customer)
    assert lease_refund(lease=lease, actor=customer, now=t0) == VOLUME_PART
    assert balance(customer) == before + VOLUME_PART
    assert refunds_left(customer, t0) == django_settings.REFUNDS_PER_MONTH - 1
    audit = AuditEntry.objects.get(action="lease_refund")
    assert audit.detail["amount_cents"] == VOLUME_PART and audit.detail["invoices"] == [invoice.pk]


# --- what a refund leaves behind ----------------------------------------------------------------

def test_refunding_a_lease_voids_its_open_invoices_and_nothing_else(catalog, customer, other_customer, t0):
    lease, order_invoice = order(customer, t0, pay=False)
    topup = topup_invoice_create(customer=customer, amount_cents=10_000, now=t0)
    other_lease, other_order = order(other_customer, t0, pay=False)
    assert lease_refund(lease=lease, actor=customer, now=t0) == 0
    order_invoice = fresh(order_invoice)
    assert order_invoice.state == Invoice.State.VOID and order_invoice.note == "refunded"  # can no longer be paid
    assert fresh(topup).state == Invoice.State.OPEN and fresh(topup).note == ""
    assert fresh(other_order).state == Invoice.State.OPEN and fresh(other_lease).state == LeaseState.PENDING


def test_a_refund_records_who_refunded_why_and_how_long_the_instance_ran(catalog, customer, t0, settings):
    from rental.lifecycle import sweep_provisioning

    settings.HOST_AGENT_FAKE_DELAY = 0
    lease, invoice = paid(customer, t0)
    sweep_provisioning(t0)
    lease = fresh(lease)
    assert lease.state == LeaseState.ACTIVE and lease.started_at == t0
    now = t0 + timedelta(minutes=10)
    assert lease_refund(lease=lease, actor=customer, now=now) == PRICE
    [row] = refund_rows(customer)
    assert row.amount_cents == PRICE and row.invoice_id == invoice.pk and row.actor_id == customer.pk
    assert row.memo == f"refund of lease #{lease.pk}"
    event = LeaseEvent.objects.get(lease=lease, kind="cancelled")
    assert event.actor_id == customer.pk and event.reason == "refund within the refund window"
    audit = AuditEntry.objects.get(action="lease_refund", object_id=str(lease.pk))
    assert audit.actor_id == customer.pk
    assert audit.detail == {"amount_cents": PRICE, "by_customer": True, "used_minutes": 10,
                            "invoices": [invoice.pk]}


# --- a lease that failed to provision -----------------------------------------------------------

def test_a_failed_provisioning_refunds_only_that_leases_invoices(catalog, customer, other_customer, t0):
    lease, invoice = paid(customer, t0)
    other_lease, other_invoice = paid(other_customer, t0)
    mine_too, my_other_invoice = paid(customer, t0)
    now = past_the_deadline(t0)
    assert lease_fail_and_refund(lease=lease, now=now) == PRICE
    assert fresh(invoice).refunded_cents == PRICE
    assert fresh(other_invoice).refunded_cents == 0 and fresh(my_other_invoice).refunded_cents == 0
    assert balance(customer) == PRICE and balance(other_customer) == 0
    assert fresh(other_lease).state == LeaseState.PROVISIONING and fresh(mine_too).state == LeaseState.PROVISIONING


def test_a_failed_provisioning_records_the_refund_on_the_invoice_the_ledger_and_the_lease(catalog, customer, t0):
    lease, invoice = paid(customer, t0)
    now = past_the_deadline(t0)
    assert lease_fail_and_refund(lease=lease, now=now) == PRICE
    invoice = fresh(invoice)
    assert invoice.refunded_cents == PRICE and invoice.refunded_at == now
    [row] = refund_rows(customer)
    assert row.amount_cents == PRICE and row.invoice_id == invoice.pk and row.at == now
    assert row.memo == f"lease #{lease.pk} could not be provisioned" and row.actor is None
    event = LeaseEvent.objects.get(lease=lease, kind="provisioning_failed")
    assert event.to_state == LeaseState.FAILED
    assert event.reason == "no instance came up within the provisioning deadline"
    assert refunds_left(customer, now) == django_settings.REFUNDS_PER_MONTH  # not the customer's refund


def test_a_failed_provisioning_cancels_a_pending_volume_addon_and_refunds_all_of_it(catalog, customer, t0):
    lease, invoice = paid(customer, t0, addons=ADDON)
    row = OrderedVolume.objects.get(lease=lease)
    assert row.state == "pending"
    now = past_the_deadline(t0)
    assert lease_fail_and_refund(lease=lease, now=now) == PRICE + VOLUME_PART
    row.refresh_from_db()
    assert row.state == "refunded" and row.settled_at == now and row.volume_id is None  # never created
    assert balance(customer) == PRICE + VOLUME_PART
    assert fresh(invoice).refunded_cents == PRICE + VOLUME_PART
    assert [r.amount_cents for r in refund_rows(customer)] == [PRICE + VOLUME_PART]   # one refund
    notice = Notification.objects.get(lease=lease, kind="provisioning_failed")
    assert format_usd(PRICE + VOLUME_PART) in notice.body          # what came back, the volume's part too


def test_a_failed_provisioning_tells_the_customer_what_happened(catalog, customer, t0, settings):
    lease, _ = paid(customer, t0)
    now = past_the_deadline(t0)
    lease_fail_and_refund(lease=lease, now=now)
    notice = Notification.objects.get(lease=lease, kind="provisioning_failed")
    minutes = int(settings.NODE_PROVISIONING_DEADLINE.total_seconds() // 60)
    assert notice.subject == f"Lease #{lease.pk} ({lease.offer.display_name}) could not be provisioned"
    assert notice.body == (f"We could not start your instance of lease #{lease.pk} within {minutes} minutes. The "
                           "lease is cancelled, its GPUs are freed and $65 is back on your balance; you can "
                           "order again at once.")
    assert notice.deadline == now


def test_a_failed_provisioning_notice_is_in_the_customers_language(catalog, customer, t0):
    CustomerSettings.objects.update_or_create(user=customer, defaults={"language": "zh-hans"})
    lease, _ = paid(customer, t0)
    lease_fail_and_refund(lease=lease, now=past_the_deadline(t0))
    notice = Notification.objects.get(lease=lease, kind="provisioning_failed")
    assert notice.subject == f"租约 #{lease.pk}（{lease.offer.display_name}）未能开通"


def test_a_failed_provisioning_voids_what_is_still_open_for_the_lease_and_nothing_else(
        catalog, customer, other_customer, t0):
    lease, _ = paid(customer, t0)
    # whatever is still open for the lease (a renewal, say) can no longer buy anything
    renewal = Invoice.objects.create(customer=customer, lease=lease, kind=Invoice.Kind.RENEWAL, term_start=t0,
                                     amount_cents=PRICE, created_at=t0)
    topup = topup_invoice_create(customer=customer, amount_cents=10_000, now=t0)
    other_lease, other_order = order(other_customer, t0, pay=False)
    lease_fail_and_refund(lease=lease, now=past_the_deadline(t0))
    renewal = fresh(renewal)
    assert renewal.state == Invoice.State.VOID and renewal.note == "lease failed to provision"
    assert fresh(topup).state == Invoice.State.OPEN and fresh(topup).note == ""
    assert fresh(other_order).state == Invoice.State.OPEN and fresh(other_lease).state == LeaseState.PENDING
