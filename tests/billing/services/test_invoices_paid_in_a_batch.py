"""`invoices_mark_paid`, the one place an invoice becomes paid (a payment watcher's pass pays
its batch through it; `invoice_mark_paid` is a batch of one): each open invoice of the batch is
paid once, what it bought is delivered, an invoice that can no longer buy its term goes to the
balance, and a paid invoice in the batch or a second call pays nothing again."""
from datetime import timedelta

import pytest

from billing.models import Invoice, LedgerEntry
from billing.renewals import renewal_invoice_issue
from billing.services import account_for, invoices_mark_paid, topup_invoice_create
from rental.models import LeaseEvent, LeaseState
from rental.services import lease_cancel
from tests.automation.helpers import active_lease, drain_balance
from tests.billing.payments_helpers import fresh
from tests.factories import new_customer, order

pytestmark = pytest.mark.django_db
WEEK = timedelta(days=7)


def test_a_mixed_batch_pays_each_open_invoice_once_and_delivers_what_it_bought(catalog, t0):
    alice, bob = new_customer("alice"), new_customer("bob")
    ordered, _ = order(alice, t0, pay=False)
    ordered_invoice = ordered.invoices.get()
    renewed = active_lease(bob, t0)
    drain_balance(bob, t0)
    renewal, _ = renewal_invoice_issue(lease=renewed, now=renewed.ends_at - timedelta(hours=23))
    topup = topup_invoice_create(customer=alice, amount_cents=2500, now=t0)
    gone, _ = order(bob, t0, pay=False)                 # cancelled while its invoice stayed open
    gone_invoice = gone.invoices.get()
    assert lease_cancel(lease_id=gone.pk, now=t0, from_states=[LeaseState.PENDING], reason="operator")
    already, _ = order(alice, t0, pay=False)
    already_invoice = already.invoices.get()
    invoices_mark_paid([already_invoice], via="LTC", now=t0)
    ends, now = renewed.ends_at, t0 + timedelta(minutes=5)
    balances = {c.pk: account_for(c).balance_cents for c in (alice, bob)}

    batch = [ordered_invoice, fresh(already_invoice), renewal, topup, gone_invoice]
    paid = invoices_mark_paid(batch, via="BTC", now=now)

    assert [i.pk for i in paid] == [ordered_invoice.pk, renewal.pk, topup.pk, gone_invoice.pk]
    for invoice in paid:
        invoice = fresh(invoice)
        assert (invoice.state, invoice.paid_at, invoice.paid_via) == (Invoice.State.PAID, now, "BTC")
    assert fresh(already_invoice).paid_via == "LTC"        # paid before: untouched
    assert fresh(ordered).state == LeaseState.PROVISIONING
    assert LeaseEvent.objects.filter(lease=ordered, kind="paid").count() == 1
    assert fresh(renewed).ends_at == ends + WEEK
    assert fresh(gone).state == LeaseState.CANCELLED
    late = LedgerEntry.objects.get(kind=LedgerEntry.Kind.LATE_PAYMENT)
    assert (late.invoice_id, late.amount_cents) == (gone_invoice.pk, gone_invoice.amount_cents)
    assert account_for(alice).balance_cents == balances[alice.pk] + 2500
    assert account_for(bob).balance_cents == balances[bob.pk] + gone_invoice.amount_cents

    rows = LedgerEntry.objects.count()
    assert invoices_mark_paid(batch, via="BTC", now=now + timedelta(minutes=1)) == []
    assert LedgerEntry.objects.count() == rows
    assert fresh(renewed).ends_at == ends + WEEK
