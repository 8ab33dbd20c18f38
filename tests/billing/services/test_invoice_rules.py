"""The payment and renewal rules the second mutation pass over billing/services.py found
untested (session 16): paying an invoice that is no longer open (refused, nothing charged), the
renewal notice in the customer's language while the invoice line stays English, "extend" paid
from the balance on the lease's timeline, renewals paid together in one batch, paying one invoice
and no other (its webhook and lease at the payment's time), a top-up's webhook without a lease, a
settlement's note as stored and who settled it, a restore's and an order event's who and when, and
the price of a month and of add-ons per TB, egress overage billed on one renewal only."""
from datetime import timedelta

import pytest
from django.utils import translation

from billing.egress import egress_record
from billing.models import Invoice, LedgerEntry
from billing.renewals import lease_extend_order, renewal_invoice_issue, renewal_invoices_create
from billing.services import (
    BillingError,
    account_for,
    balance_top_up,
    checkout_place_order,
    invoice_mark_paid,
    invoice_pay_from_balance,
    invoice_settle_manually,
    order_invoice_expire,
    topup_invoice_create,
)
from inventory.models import Offer, Site, StorageProduct
from rental.models import CustomerSettings, Image, LeaseEvent, LeaseState, Notification, Snapshot
from rental.notifications.models import Dispatch, WebhookDelivery
from rental.notifications.services import webhook_endpoint_save
from tests.automation.helpers import KEY, WEEK, active_lease, drain_balance
from tests.billing.payments_helpers import fresh
from tests.billing.rule_orders import PRICE, order

# --- paying from the balance --------------------------------------------------------------------

def test_an_invoice_no_longer_open_is_refused_and_costs_nothing(catalog, customer, t0):
    lease, invoice = order(customer, t0)
    assert order_invoice_expire(invoice=invoice, now=invoice.expires_at) is True
    balance_top_up(customer=customer, amount_cents=PRICE, now=t0)
    with pytest.raises(BillingError) as refused:
        invoice_pay_from_balance(invoice=invoice, now=invoice.expires_at, actor=customer)
    assert str(refused.value) == f"Invoice #{invoice.pk} is no longer open."
    assert account_for(customer).balance_cents == PRICE  # the payment's ledger row was rolled back
    assert not LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.ORDER).exists()
    assert fresh(invoice).state == Invoice.State.EXPIRED and fresh(lease).state == LeaseState.CANCELLED

    top_up = topup_invoice_create(customer=customer, amount_cents=1000, now=t0)
    with pytest.raises(BillingError) as refused:
        invoice_pay_from_balance(invoice=top_up, now=t0, actor=customer)
    assert str(refused.value) == "A top-up cannot be paid from the balance."
    assert account_for(customer).balance_cents == PRICE and fresh(top_up).state == Invoice.State.OPEN


# --- renewals -----------------------------------------------------------------------------------

def test_the_renewal_notice_is_in_the_customers_language_and_the_line_in_english(catalog, customer, t0):
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)
    CustomerSettings.objects.filter(user=customer).update(language="zh-hans")
    with translation.override("zh-hans"):  # e.g. issued by "extend" from a page in Chinese
        invoice, created = renewal_invoice_issue(lease=fresh(lease), now=lease.ends_at - timedelta(hours=23))
    assert created
    [line] = invoice.lines.all()
    assert line.description == f"Renewal of lease #{lease.pk}: RTX 3090, 1 week (7 days)"
    notice = Notification.objects.get(lease=lease, kind="renewal_invoice")
    assert notice.subject == f"租约 #{lease.pk} 的续费账单 #{invoice.pk}"


def test_extend_paid_from_the_balance_names_the_customer_on_the_lease_timeline(catalog, customer, t0):
    lease = active_lease(customer, t0, balance_cents=PRICE)
    end = lease.ends_at
    invoice = lease_extend_order(lease=lease, actor=customer, pay_from_balance=True, now=t0 + timedelta(days=1))
    extended = LeaseEvent.objects.get(lease=lease, kind="extended")
    assert (extended.actor, extended.reason) == (customer, f"renewal invoice #{invoice.pk} paid")
    assert fresh(lease).ends_at == end + WEEK


def test_renewals_paid_together_are_returned_paid(catalog, customer, other_customer, t0):
    leases = [active_lease(customer, t0, balance_cents=PRICE), active_lease(other_customer, t0, balance_cents=PRICE)]
    ends, now = [lease.ends_at for lease in leases], leases[0].ends_at - timedelta(hours=23)
    made = renewal_invoices_create(leases, now=now)
    assert [(i.state, i.paid_at, i.paid_via, i.note, i.settled_by) for i in made] == [
        (Invoice.State.PAID, now, "balance", "", None)] * 2
    assert [fresh(i).state for i in made] == [Invoice.State.PAID] * 2
    assert [fresh(lease).ends_at for lease in leases] == [end + WEEK for end in ends]


def test_egress_overage_is_billed_on_one_renewal_only(catalog, customer, t0):
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)
    egress_record(lease_id=lease.pk, tb_used=27, at=t0 + timedelta(days=1))
    end = lease.ends_at
    first, created = renewal_invoice_issue(lease=lease, now=end - timedelta(hours=23))
    [_, overage] = first.lines.order_by("pk")
    assert created and overage.description.startswith("Egress beyond") and first.amount_cents > PRICE
    balance_top_up(customer=customer, amount_cents=first.amount_cents, now=end - timedelta(hours=22))
    invoice_pay_from_balance(invoice=first, now=end - timedelta(hours=22))
    lease = fresh(lease)
    second, created = renewal_invoice_issue(lease=lease, now=lease.ends_at - timedelta(hours=23))
    assert created and [line.unit_cents for line in second.lines.all()] == [PRICE]  # not billed again
    assert second.amount_cents == PRICE


# --- what a payment records ---------------------------------------------------------------------

def test_paying_one_invoice_pays_only_that_one_and_says_so_at_that_time(catalog, customer, other_customer, t0,
                                                                       settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    webhook_endpoint_save(customer=customer, url="http://127.0.0.1:9/hook", now=t0)
    lease, invoice = order(customer, t0)
    _, mine_too = order(customer, t0)
    _, theirs = order(other_customer, t0)
    top_up = topup_invoice_create(customer=customer, amount_cents=1000, now=t0)
    paid_at = t0 + timedelta(minutes=7)
    assert invoice_mark_paid(invoice=invoice, via="LTC", now=paid_at) is True
    assert [fresh(i).state for i in (invoice, mine_too, theirs, top_up)] == [
        Invoice.State.PAID, Invoice.State.OPEN, Invoice.State.OPEN, Invoice.State.OPEN]
    assert (fresh(invoice).paid_at, fresh(invoice).note) == (paid_at, "")
    assert WebhookDelivery.objects.get(event="invoice.paid").created_at == paid_at
    claim = Dispatch.objects.get(event="invoice.paid")  # the lease's timeline of notices and events
    assert (claim.created_at, claim.lease_id, claim.customer_id) == (paid_at, lease.pk, customer.pk)


def test_a_paid_top_up_tells_an_integration_without_a_lease(db, customer, t0, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    webhook_endpoint_save(customer=customer, url="http://127.0.0.1:9/hook", now=t0)
    top_up = topup_invoice_create(customer=customer, amount_cents=2500, now=t0)
    assert invoice_mark_paid(invoice=top_up, via="XMR", now=t0) is True
    paid = WebhookDelivery.objects.get(event="invoice.paid")
    assert paid.payload["term"] == f"invoice:{top_up.pk}"
    assert paid.payload["data"] == {"invoice": {"id": top_up.pk, "kind": "topup", "state": "paid", "lease": None,
                                                "amount_cents": 2500, "term_start": None, "paid_via": "XMR"},
                                     "customer": "alice"}  # no lease


def test_a_paid_renewal_tells_an_integration_which_term_it_pays(catalog, customer, t0, settings):
    """invoice.paid of a renewal carries the term it pays for: the lease's old end, in ISO 8601."""
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    lease = active_lease(customer, t0)
    drain_balance(customer, t0)
    webhook_endpoint_save(customer=customer, url="http://127.0.0.1:9/hook", now=t0)
    renewal, created = renewal_invoice_issue(lease=lease, now=lease.ends_at - timedelta(hours=23))
    assert created and renewal.term_start == lease.ends_at
    assert invoice_mark_paid(invoice=renewal, via="BTC", now=lease.ends_at - timedelta(hours=22)) is True
    paid = WebhookDelivery.objects.get(event="invoice.paid")
    assert paid.payload["data"]["invoice"] == {
        "id": renewal.pk, "kind": "renewal", "state": "paid", "lease": lease.pk, "amount_cents": PRICE,
        "term_start": lease.ends_at.isoformat(), "paid_via": "BTC"}


def test_a_settlement_keeps_300_characters_of_its_note_and_names_only_a_real_settler(catalog, customer, operator,
                                                                                      t0):
    _, invoice = order(customer, t0)
    assert invoice_settle_manually(invoice=invoice, actor=operator, note="wire " + "x" * 400, now=t0) is True
    invoice = fresh(invoice)
    assert (invoice.note, invoice.settled_by, invoice.paid_via) == ("wire " + "x" * 295, operator, "manual")
    _, other = order(customer, t0)
    assert invoice_mark_paid(invoice=other, via="manual", now=t0, note="by the reconciliation job") is True
    other = fresh(other)
    assert (other.state, other.settled_by, other.note) == (Invoice.State.PAID, None, "by the reconciliation job")


# --- placing an order ---------------------------------------------------------------------------

def test_a_restore_and_the_order_event_carry_who_and_when(catalog, customer, t0, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    balance_top_up(customer=customer, amount_cents=PRICE, now=t0)
    source, _ = order(customer, t0, pay=True)
    site = Site.objects.get(code="DFW-1")
    snapshot = Snapshot.objects.create(customer=customer, source_lease=source, region=site.region, site=site, size_tb=1,
                                       created_at=t0, paid_until=t0, ready_at=t0, state=Snapshot.State.AVAILABLE,
                                       restic_snapshot="0123abcd", repository="s3:http://rgw.invalid/snap",
                                       content_bytes=10**9)
    webhook_endpoint_save(customer=customer, url="http://127.0.0.1:9/hook", now=t0)
    placed_at = t0 + timedelta(minutes=5)
    lease, _ = order(customer, placed_at, restore_from=snapshot)
    restore = LeaseEvent.objects.get(lease=lease, kind="restore_from_snapshot")
    assert (restore.at, restore.actor) == (placed_at, customer)
    assert WebhookDelivery.objects.get(event="order.placed").created_at == placed_at


def test_a_term_is_billed_at_its_price_and_add_ons_per_tb_pro_rata(catalog, customer, t0):
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    image = Image.objects.get(slug="pytorch-2.5-cuda-12.4")
    lease, invoice = checkout_place_order(customer=customer, offer=offer, site=site, term="month", image=image,
                                          ssh_public_key=KEY, addons={"network_volume_tb": 0}, now=t0)
    assert offer.monthly_cents != offer.weekly_cents
    assert invoice.amount_cents == fresh(lease).price_cents == offer.monthly_cents  # 0 TB: no line
    assert [(line.quantity, line.unit_cents) for line in invoice.lines.all()] == [(1, offer.monthly_cents)]

    _, invoice = order(customer, t0, addons={"extra_nvme_tb": 2, "network_volume_tb": 3})
    nvme, volume = (StorageProduct.objects.get(kind=kind).get_kind_display() for kind in ("extra_nvme", "network_volume"))
    assert [(line.description, line.quantity, line.unit_cents) for line in invoice.lines.all()] == [
        ("RTX 3090, 1 week (7 days)", 1, PRICE),
        (f"{nvme}, 1 week (7 days), per TB", 2, 210),  # $9 per TB-month × 7/30
        (f"{volume}, 1 week (7 days), per TB", 3, 327),  # $14 × 7/30 = 326.67, rounded up
    ]
    assert invoice.amount_cents == PRICE + 2 * 210 + 3 * 327
