"""The order and renewal rules the first mutation run of billing/services.py's order and
renewal services found untested (session 16): what an order paid from the balance writes
(the ledger row, by whom, the invoice's payment), how long an unpaid order holds and when it
expires (the deadline's own second), a snapshot that fills the new disk exactly, the events
an integration receives for an order and its payment, "extend" (the furthest ahead it may
go, a suspended lease, the refusal naming the state, the audit row), the renewal invoice's
line and notice, and a top-up's limits."""
from datetime import timedelta

import pytest
from django.conf import settings
from django.urls import reverse

from billing.models import Invoice, LedgerEntry
from billing.refunds import lease_refund
from billing.renewals import lease_extend_order, renewal_invoice_create
from billing.services import (
    BillingError,
    TooManyOpenOrders,
    account_for,
    addons_validate,
    balance_top_up,
    invoice_mark_paid,
    invoice_pay_from_balance,
    invoice_settle_manually,
    order_invoice_expire,
    topup_invoice_create,
)
from inventory.models import AuditEntry, Offer, Site
from ops.lifecycle import run_lifecycle
from rental.lifecycle import sweep_release
from rental.models import LeaseEvent, LeaseState, Notification, Snapshot
from rental.notifications.models import WebhookDelivery
from rental.notifications.notices import public_url
from rental.notifications.services import webhook_endpoint_save
from rental.storage import StorageRefused
from tests.automation.helpers import WEEK, active_lease, drain_balance
from tests.billing.payments_helpers import fresh
from tests.billing.rule_orders import PRICE, order

# --- an order -----------------------------------------------------------------------------------

def test_an_order_paid_from_the_balance_is_one_ledger_row_by_the_customer(catalog, customer, t0):
    balance_top_up(customer=customer, amount_cents=PRICE + 1, now=t0)
    lease, invoice = order(customer, t0, pay=True)
    invoice = fresh(invoice)
    assert (invoice.kind, invoice.state, invoice.amount_cents) == (Invoice.Kind.ORDER, Invoice.State.PAID, PRICE)
    assert (invoice.paid_via, invoice.paid_at, invoice.settled_by) == ("balance", t0, None)
    [row] = LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.ORDER)
    assert (row.amount_cents, row.invoice_id, row.actor, row.memo) == (-PRICE, invoice.pk, customer,
                                                                      f"invoice #{invoice.pk}")
    assert account_for(customer).balance_cents == 1
    assert fresh(lease).state == LeaseState.PROVISIONING
    paid = LeaseEvent.objects.get(lease=lease, kind="paid")  # the lease's timeline names the invoice
    assert (paid.at, paid.actor, paid.reason) == (t0, customer, f"invoice #{invoice.pk}")


def test_an_unpaid_order_holds_for_the_window_and_expires_at_its_last_second(catalog, customer, other_customer, t0,
                                                                             settings):
    lease, invoice = order(customer, t0)
    theirs, their_invoice = order(other_customer, t0)  # as late, but not the one expired here
    top_up = topup_invoice_create(customer=customer, amount_cents=10_000, now=t0)
    window = timedelta(minutes=settings.PAYMENT_WINDOW_MINUTES)
    assert invoice.expires_at == t0 + window == fresh(lease).pay_by
    assert invoice.amount_cents == PRICE and fresh(lease).price_cents == PRICE

    assert order_invoice_expire(invoice=invoice, now=invoice.expires_at - timedelta(seconds=1)) is False
    assert fresh(invoice).state == Invoice.State.OPEN and fresh(lease).state == LeaseState.PENDING
    assert order_invoice_expire(invoice=invoice, now=invoice.expires_at) is True
    assert fresh(invoice).state == Invoice.State.EXPIRED and fresh(lease).state == LeaseState.CANCELLED
    cancelled = LeaseEvent.objects.get(lease=lease, kind="cancelled")  # the lease's timeline says why
    assert (cancelled.at, cancelled.reason) == (invoice.expires_at,
                                                f"invoice #{invoice.pk} not paid within the payment window")
    assert order_invoice_expire(invoice=invoice, now=invoice.expires_at) is False  # once
    assert fresh(their_invoice).state == Invoice.State.OPEN and fresh(theirs).state == LeaseState.PENDING
    assert fresh(top_up).state == Invoice.State.OPEN


def test_a_snapshot_that_fills_the_new_disk_exactly_can_be_restored_one_byte_more_cannot(catalog, customer, t0):
    balance_top_up(customer=customer, amount_cents=10 * PRICE, now=t0)
    source, _ = order(customer, t0, pay=True)
    site, offer = Site.objects.get(code="DFW-1"), Offer.objects.get(slug="rtx-3090")
    disk = (offer.gpu_model.included_nvme_gb + 2000) * 10**9  # with 2 TB of extra NVMe

    def snapshot(content_bytes):
        return Snapshot.objects.create(customer=customer, source_lease=source, region=site.region, site=site,
                                       size_tb=1, created_at=t0, paid_until=t0, ready_at=t0,
                                       state=Snapshot.State.AVAILABLE, restic_snapshot="0123abcd",
                                       repository="s3:http://rgw.invalid/snap", content_bytes=content_bytes)

    included = offer.gpu_model.included_nvme_gb * 10**9  # without extra NVMe
    for size, addons in ((included, None), (disk, {"extra_nvme_tb": 2})):
        with pytest.raises(StorageRefused, match="more than this lease"):
            order(customer, t0, addons=addons, restore_from=snapshot(size + 1))
        fits = snapshot(size)
        lease, _ = order(customer, t0, addons=addons, restore_from=fits)
        assert fresh(lease).restore_from_id == fits.pk and fresh(lease).extra_nvme_tb == (addons or {}).get(
            "extra_nvme_tb", 0)


def test_an_integration_hears_of_the_order_and_of_its_payment(catalog, customer, t0, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    webhook_endpoint_save(customer=customer, url="http://127.0.0.1:9/hook", now=t0)
    lease, invoice = order(customer, t0)
    placed = WebhookDelivery.objects.get(event="order.placed")
    assert placed.payload["data"]["invoice"] == {
        "id": invoice.pk, "kind": "order", "state": "open", "lease": lease.pk, "amount_cents": PRICE,
        "term_start": None, "paid_via": None}
    assert placed.payload["data"]["lease"]["id"] == lease.pk

    balance_top_up(customer=customer, amount_cents=PRICE, now=t0)
    invoice_pay_from_balance(invoice=invoice, now=t0, actor=customer)
    paid = WebhookDelivery.objects.get(event="invoice.paid")
    assert paid.payload["term"] == f"invoice:{invoice.pk}"
    assert paid.payload["data"]["invoice"]["state"] == "paid" and paid.payload["data"]["invoice"]["paid_via"] == "balance"
    assert paid.payload["data"]["lease"]["id"] == lease.pk


# --- "extend" -----------------------------------------------------------------------------------

def test_extend_reaches_exactly_the_configured_days_ahead(catalog, customer, t0, settings):
    lease = active_lease(customer, t0, balance_cents=3 * PRICE)
    settings.LEASE_EXTEND_MAX_AHEAD_DAYS = 14
    end = lease.ends_at
    at = end - timedelta(days=14)  # paid until exactly 14 days ahead: one more term is allowed
    invoice = lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=at)
    assert invoice.state == Invoice.State.PAID and fresh(lease).ends_at == end + WEEK
    [row] = LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.RENEWAL)
    assert (row.amount_cents, row.invoice_id, row.actor) == (-PRICE, invoice.pk, customer)  # who paid it
    with pytest.raises(BillingError) as refused:
        lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=at)  # 21 days ahead
    assert str(refused.value) == (f"Lease #{lease.pk} is paid until {end + WEEK:%Y-%m-%d %H:%M} UTC; extend it "
                                  "again closer to that date.")


def test_a_suspended_lease_can_be_extended_and_the_audit_says_what_was_asked(catalog, customer, t0):
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)
    run_lifecycle(lease.ends_at + timedelta(minutes=1))
    assert fresh(lease).state == LeaseState.SUSPENDED
    invoice = lease_extend_order(lease=lease, actor=customer, now=lease.ends_at + timedelta(minutes=2))
    assert (invoice.kind, invoice.state, invoice.term_start) == ("renewal", "open", lease.ends_at)
    entry = AuditEntry.objects.filter(action="lease_extend_order").get()
    assert entry.actor == customer and entry.object_id == str(lease.pk)
    assert entry.detail == {"invoice": invoice.pk, "term_start": lease.ends_at.isoformat(), "created": False,
                            "pay_from_balance": False}


def test_extend_refuses_someone_else_and_an_ended_lease_naming_its_state(catalog, customer, other_customer, t0):
    lease = active_lease(customer, t0)
    with pytest.raises(BillingError) as refused:
        lease_extend_order(lease=lease, actor=other_customer, now=t0 + timedelta(minutes=4))
    assert str(refused.value) == "Only the lease's customer can extend it."
    lease_refund(lease=lease, actor=customer, now=t0 + timedelta(minutes=4))  # ran a minute: cancelled, refunded
    assert fresh(lease).state == LeaseState.CANCELLED and lease.ends_at is not None
    with pytest.raises(BillingError) as refused:
        lease_extend_order(lease=lease, actor=customer, now=t0 + timedelta(minutes=5))
    assert str(refused.value) == (f"Lease #{lease.pk} is {lease.get_state_display()}: only a running or "
                                  "suspended lease can be extended.")
    assert not Invoice.objects.filter(lease=lease, kind=Invoice.Kind.RENEWAL).exists()


# --- top-ups ------------------------------------------------------------------------------------

def test_a_top_up_is_from_one_dollar_to_ten_million(db, customer, t0, settings):
    for cents in (99, 10_000_000_01):
        with pytest.raises(BillingError) as refused:
            topup_invoice_create(customer=customer, amount_cents=cents, now=t0)
        assert str(refused.value) == "A top-up is between $1 and $10,000,000."
    low = topup_invoice_create(customer=customer, amount_cents=100, now=t0)
    high = topup_invoice_create(customer=customer, amount_cents=10_000_000_00, now=t0)
    assert (low.kind, low.amount_cents, high.amount_cents) == (Invoice.Kind.TOPUP, 100, 10_000_000_00)
    assert low.expires_at == t0 + timedelta(minutes=settings.PAYMENT_WINDOW_MINUTES) and low.lease is None
    assert [(line.description, line.quantity, line.unit_cents) for line in low.lines.all()] == [
        ("Balance top-up", 1, 100)]


# --- renewals -----------------------------------------------------------------------------------

def test_the_renewal_invoice_bills_the_next_term_once_and_tells_the_customer(catalog, customer, t0):
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)
    end, now = lease.ends_at, lease.ends_at - timedelta(hours=23)
    invoice = renewal_invoice_create(lease=lease, now=now)
    assert (invoice.kind, invoice.state, invoice.term_start, invoice.amount_cents, invoice.created_at) == (
        Invoice.Kind.RENEWAL, Invoice.State.OPEN, end, PRICE, now)
    assert [(line.description, line.quantity, line.unit_cents, line.amount_cents) for line in invoice.lines.all()] \
        == [(f"Renewal of lease #{lease.pk}: RTX 3090, 1 week (7 days)", 1, PRICE, PRICE)]
    notice = Notification.objects.get(lease=lease, kind="renewal_invoice")
    assert (notice.deadline, notice.subject, notice.body) == (
        end, f"Renewal invoice #{invoice.pk} for lease #{lease.pk}",
        f"Renewal of lease #{lease.pk}: $65, due before {end:%Y-%m-%d %H:%M} UTC. Pay it at "
        f"{public_url(reverse('payments:invoice', args=[invoice.pk]))} — choose a coin there, and its amount is "
        f"fixed for {settings.PAYMENT_WINDOW_MINUTES} minutes from then.")
    assert renewal_invoice_create(lease=lease, now=now + timedelta(hours=1)) is None  # once per term
    assert Invoice.objects.filter(lease=lease, kind=Invoice.Kind.RENEWAL).count() == 1


def test_an_auto_renewal_the_balance_covers_is_paid_and_extends_the_lease(catalog, customer, t0):
    lease = active_lease(customer, t0, balance_cents=PRICE)
    end, now = lease.ends_at, lease.ends_at - timedelta(hours=23)
    before = account_for(customer).balance_cents
    invoice = renewal_invoice_create(lease=lease, now=now)
    invoice = fresh(invoice)
    assert (invoice.state, invoice.paid_via, invoice.paid_at) == (Invoice.State.PAID, "balance", now)
    [row] = LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.RENEWAL)
    assert (row.amount_cents, row.invoice_id, row.actor, row.memo) == (-PRICE, invoice.pk, None,
                                                                      f"invoice #{invoice.pk}")
    assert account_for(customer).balance_cents == before - PRICE
    assert fresh(lease).ends_at == end + WEEK
    extended = LeaseEvent.objects.get(lease=lease, kind="extended")
    assert extended.reason == f"renewal invoice #{invoice.pk} paid"


def test_a_renewal_paid_after_its_lease_was_released_goes_to_the_balance(catalog, customer, t0):
    """The payment got there before the pass that voids a released lease's renewal."""
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)
    run_lifecycle(lease.ends_at - timedelta(hours=23))
    renewal = Invoice.objects.get(lease=lease, kind=Invoice.Kind.RENEWAL)
    run_lifecycle(lease.ends_at + timedelta(minutes=1))  # suspended, held for 72 h
    later = lease.ends_at + timedelta(days=4)
    sweep_release(later)
    assert fresh(lease).state == LeaseState.RELEASED and fresh(renewal).state == Invoice.State.OPEN
    assert invoice_mark_paid(invoice=renewal, via="LTC", now=later) is True
    assert (fresh(renewal).state, fresh(renewal).paid_via) == (Invoice.State.PAID, "LTC")
    [row] = LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.LATE_PAYMENT)
    assert (row.amount_cents, row.invoice_id, row.memo) == (PRICE, renewal.pk,
                                                          f"invoice #{renewal.pk} paid after its lease ended")
    assert account_for(customer).balance_cents == PRICE and fresh(lease).state == LeaseState.RELEASED
    assert invoice_mark_paid(invoice=renewal, via="LTC", now=later) is False  # once


# --- manual settlement, top-ups, add-ons, the unpaid limit --------------------------------------

def test_a_manual_settlement_needs_a_note_and_records_who(catalog, customer, operator, t0):
    lease, invoice = order(customer, t0)
    with pytest.raises(BillingError) as refused:
        invoice_settle_manually(invoice=invoice, actor=operator, note="  ", now=t0)
    assert str(refused.value) == "A manual settlement needs a note saying why."
    assert fresh(invoice).state == Invoice.State.OPEN
    assert invoice_settle_manually(invoice=invoice, actor=operator, note="wire ref 991", now=t0) is True
    invoice = fresh(invoice)
    assert (invoice.state, invoice.paid_via, invoice.paid_at, invoice.settled_by, invoice.note) == (
        Invoice.State.PAID, "manual", t0, operator, "wire ref 991")
    assert fresh(lease).state == LeaseState.PROVISIONING
    assert not LedgerEntry.objects.filter(account__customer=customer).exclude(kind=LedgerEntry.Kind.TOPUP).exists()


def test_a_paid_top_up_credits_its_amount_once(db, customer, t0):
    invoice = topup_invoice_create(customer=customer, amount_cents=12_345, now=t0)
    with pytest.raises(BillingError, match="cannot be paid from the balance"):
        invoice_pay_from_balance(invoice=invoice, now=t0)
    assert invoice_mark_paid(invoice=invoice, via="XMR", now=t0) is True
    assert invoice_mark_paid(invoice=invoice, via="XMR", now=t0) is False
    [row] = LedgerEntry.objects.filter(account__customer=customer)
    assert (row.kind, row.amount_cents, row.invoice_id, row.memo) == (LedgerEntry.Kind.TOPUP, 12_345, invoice.pk,
                                                                     f"invoice #{invoice.pk}")
    assert account_for(customer).balance_cents == 12_345


def test_add_ons_are_whole_terabytes_within_their_limits(catalog, customer, t0):
    assert addons_validate({"extra_nvme_tb": 30, "network_volume_tb": 0}) == {"extra_nvme_tb": 30,
                                                                              "network_volume_tb": 0}
    assert addons_validate({"network_volume_tb": 100}) == {"network_volume_tb": 100}
    for bad in ({"extra_nvme_tb": 31}, {"extra_nvme_tb": -1}, {"extra_nvme_tb": True}, {"extra_nvme_tb": 1.0},
                {"extra_nvme_tb": "1"}):
        with pytest.raises(BillingError) as refused:
            addons_validate(bad)
        assert str(refused.value) == "extra_nvme_tb must be a whole number of TB from 0 to 30."
    with pytest.raises(BillingError) as refused:
        addons_validate({"snapshot_tb": 1, "gpu_tb": 2, "extra_nvme_tb": 1})
    assert str(refused.value) == "Unknown add-on: gpu_tb, snapshot_tb."


def test_the_unpaid_order_limit_names_itself(catalog, customer, t0, settings):
    settings.MAX_OPEN_UNPAID_ORDERS = 1
    order(customer, t0)
    with pytest.raises(TooManyOpenOrders) as refused:
        order(customer, t0)
    assert str(refused.value) == ("You already have 1 unpaid orders holding GPUs: pay or cancel one before "
                                  "ordering more.")
