"""The books reconcile: for any history of orders paid from the balance or from outside it
(a coin, by hand), refunds and top-ups, the ledger export's revenue column (its entries and
the journal rows of invoices paid from outside) sums to the dashboard's net revenue and to
the per-site rows, to the cent."""
from datetime import UTC, datetime, timedelta

from django.contrib.auth.models import User
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing.refunds import lease_refund
from billing.revenue import revenue_between, revenue_by_site
from billing.services import BillingError, balance_top_up, checkout_place_order, invoice_mark_paid
from inventory.models import Offer, Site
from ops.backoffice.exports import ledger_rows
from rental.models import Image
from tests.automation.helpers import KEY

T0 = datetime(2026, 3, 10, 12, tzinfo=UTC)
STEPS = st.lists(st.tuples(st.sampled_from(["balance", "coin", "manual"]),
                           st.sampled_from(["rtx-3090", "a100-sxm"]), st.booleans()), min_size=1, max_size=4)
_users = iter(range(10**6))


@hsettings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(STEPS)
def test_the_export_sums_to_the_dashboard(catalog, steps):
    with transaction.atomic():
        user = User.objects.create_user(f"books{next(_users)}", password="x" * 20)
        balance_top_up(customer=user, amount_cents=10_000_000, now=T0)
        at = T0
        for pay, offer, refund in steps:
            at += timedelta(minutes=1)
            lease, invoice = checkout_place_order(
                customer=user, offer=Offer.objects.get(slug=offer), site=Site.objects.get(code="DFW-1"), term="week",
                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                pay_from_balance=pay == "balance", now=at)
            if pay in ("coin", "manual"):
                invoice_mark_paid(invoice=invoice, via="LTC" if pay == "coin" else "manual", now=at)
            if refund:
                try:
                    lease_refund(lease=lease, actor=user, now=at + timedelta(seconds=30))
                except BillingError:
                    pass  # over the month's refunds: the order stands
        start, end = T0 - timedelta(days=1), T0 + timedelta(days=1)
        rows = list(ledger_rows(start, end))
        header, body = rows[0], rows[1:]
        exported = sum(int(row[header.index("revenue_cents")]) for row in body)
        dashboard = revenue_between(start, end - timedelta(microseconds=1))["net_cents"]
        assert exported == dashboard == sum(site.net_cents for site in revenue_by_site(start, end))
        outside = [row for row in body if row[header.index("kind")] == "paid_outside"]
        assert len(outside) == sum(1 for pay, _o, _r in steps if pay in ("coin", "manual"))
        transaction.set_rollback(True)
