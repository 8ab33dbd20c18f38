"""The renewal sweep issues, auto-pays and extends a batch of leases in a few statements
(billing.renewals.renewal_invoices_create). The batch must write exactly what the single-lease
services write lease by lease — invoices, lines, egress overage, ledger entries, lease events,
notices, ledger claims — and one lease that conflicts or fails must not lose or double the
others."""
import json
import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing import renewals
from billing.egress import egress_record
from billing.models import Account, EgressUsage, Invoice, InvoiceLine, LedgerEntry
from billing.renewals import renewal_invoice_create, renewal_invoice_issue, renewal_invoices_create
from billing.services import balance_top_up
from inventory.models import Site
from ops.lifecycle import sweep_renewal_invoices
from rental.lifecycle import DUE_LEASE_RELATED, sweep_provisioning, sweep_release, sweep_suspend
from rental.models import CustomerSettings, DiskKey, Lease, LeaseEvent, Notification
from rental.notifications.models import Dispatch
from rental.services import lease_release, lease_suspend
from tests.billing.races import PRICE, WEEK, order
from tests.factories import new_customer

pytestmark = pytest.mark.django_db
BEFORE = ("created", "paid", "provisioned")  # the events of the order: not what is compared

#: (top-up, account auto-renew, the lease's own auto-renew, leases, egress TB in the term, language)
CUSTOMERS = [
    (2 * PRICE, True, None, 1, 0, "en"),      # covers the renewal: paid, extended
    (PRICE, True, None, 1, 0, "de"),          # the order took it all: the renewal stays open
    (2 * PRICE, False, None, 1, 0, "en"),     # auto-renew off for the account: open
    (2 * PRICE, False, True, 1, 0, "zh-hans"),  # the lease's own choice wins: paid
    (3 * PRICE, True, None, 2, 0, "en"),      # two leases, one renewal's worth left: first paid, second open
    (5 * PRICE, True, None, 1, 27, "en"),     # egress overage on the invoice: paid (4 × PRICE covers it)
]


def build(prefix: str, t0, sites) -> list[Lease]:
    leases = []
    for n, (balance, account_auto, lease_auto, count, _tb, language) in enumerate(CUSTOMERS):
        customer = new_customer(f"{prefix}{n}", balance=balance, auto_renew=account_auto, now=t0)
        CustomerSettings.objects.filter(user=customer).update(language=language)
        for _ in range(count):
            lease, _invoice = order(customer, t0, site=sites[len(leases) % len(sites)])
            if lease_auto is not None:
                Lease.objects.filter(pk=lease.pk).update(auto_renew=lease_auto)
            leases.append(lease)
    return leases


def add_egress(leases, at) -> None:
    index = 0
    for _balance, _account, _lease, count, tb, _language in CUSTOMERS:
        for lease in leases[index:index + count]:
            if tb:
                egress_record(lease_id=lease.pk, tb_used=tb, at=at)
        index += count


def due(leases) -> list[Lease]:
    """The leases as the sweep reads them (customer and settings loaded with the lease)."""
    by_pk = Lease.objects.select_related(*DUE_LEASE_RELATED).in_bulk([lease.pk for lease in leases])
    return [by_pk[lease.pk] for lease in leases]


def summary(leases, t0) -> list:
    """Everything a renewal writes, per lease, with ids replaced by the lease's place."""
    ids, customers = {}, {}  # lease and renewal ids → their place (order invoices do not occur below)
    for i, lease in enumerate(leases):
        customers.setdefault(lease.customer_id, f"C{len(customers)}")
        ids[lease.pk] = f"L{i}"
        for invoice in Invoice.objects.filter(lease=lease, kind="renewal"):
            assert invoice.pk not in ids, "a lease and a renewal share an id: the summary could not tell them apart"
            ids[invoice.pk] = f"R{i}"

    def norm(value) -> str:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        text = re.sub(r"user:(\d+)", lambda m: "user:" + customers.get(int(m[1]), "?"), text)
        text = re.sub(r'"receipt": "([a-z-]+):[^"]*"', r'"receipt": "\1:…"', text)  # the host's, per lease
        return re.sub(r"(#|lease:|invoice:|/invoice/)(\d+)", lambda m: m[1] + ids.get(int(m[2]), "?"), text)

    def rel(at):
        return str(at - t0) if at else None

    rows = []
    for lease in leases:
        lease.refresh_from_db()
        invoices = Invoice.objects.filter(lease=lease, kind="renewal").order_by("pk")
        rows.append({
            "lease": (lease.state, rel(lease.ends_at), rel(lease.hold_until)),
            "invoices": [(i.state, i.amount_cents, rel(i.term_start), i.paid_via, rel(i.paid_at), i.note)
                         for i in invoices],
            "lines": [(norm(line.description), line.quantity, line.unit_cents, line.amount_cents)
                      for line in InvoiceLine.objects.filter(invoice__in=invoices).order_by("pk")],
            "events": [(e.kind, e.from_state, e.to_state, norm(e.reason), norm(e.data), rel(e.at))
                       for e in LeaseEvent.objects.filter(lease=lease).exclude(kind__in=BEFORE).order_by("pk")],
            "notices": [(n.kind, rel(n.deadline), norm(n.subject), norm(n.body), rel(n.created_at))
                        for n in Notification.objects.filter(lease=lease).order_by("kind")],
            "claims": sorted((norm(d.recipient), d.event, norm(d.term))
                             for d in Dispatch.objects.filter(lease=lease)),
            "ledger": [(e.kind, e.amount_cents, e.balance_after_cents, norm(e.memo))
                       for e in LedgerEntry.objects.filter(account__customer=lease.customer, invoice__kind="renewal")
                       .order_by("pk")],
            "balance": Account.objects.get(customer=lease.customer).balance_cents,
            "egress": [str(u.billed_overage_tb) for u in EgressUsage.objects.filter(lease=lease)],
        })
    return rows


@pytest.fixture
def two_copies(catalog, settings):
    """The same mixed set of leases twice, active, their terms ending in an hour."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    sites = list(Site.objects.all())
    single, batch = build("single", t0, sites), build("batch", t0, sites)
    sweep_provisioning(t0)
    add_egress(single, t0 + timedelta(days=1))
    add_egress(batch, t0 + timedelta(days=1))
    return single, batch, t0, t0 + WEEK - timedelta(hours=1)


def test_a_batch_of_renewals_writes_what_the_single_lease_service_writes(two_copies):
    single, batch, t0, now = two_copies
    for lease in due(single):
        with transaction.atomic():
            renewal_invoice_create(lease=lease, now=now)
    with transaction.atomic():
        made = renewal_invoices_create(due(batch), now=now)

    assert [invoice.lease_id for invoice in made] == [lease.pk for lease in batch]
    expected = summary(single, t0)
    assert summary(batch, t0) == expected
    # and the scenario is the mixed one it claims to be
    assert [row["invoices"][0][0] for row in expected] == ["paid", "open", "open", "paid", "paid", "open", "paid"]
    assert len(expected[-1]["lines"]) == 2 and expected[-1]["egress"] != ["0.000"]  # the overage is billed once
    assert [row["lease"][1] for row in expected] == [str(2 * WEEK if paid else WEEK) for paid in
                                                     (1, 0, 0, 1, 1, 0, 1)]


def test_a_batch_of_suspensions_and_releases_writes_what_one_by_one_writes(two_copies,
                                                                           django_capture_on_commit_callbacks):
    single, batch, t0, _ = two_copies
    ended = t0 + WEEK + timedelta(minutes=1)
    over = ended + timedelta(hours=72, minutes=1)
    with django_capture_on_commit_callbacks(execute=True):  # the host's part (stop, key destruction)
        for lease in single:
            lease_suspend(lease_id=lease.pk, now=ended)
    with django_capture_on_commit_callbacks(execute=True):
        assert len(sweep_suspend(ended)) == len(batch)  # the batch: the copy still active
    with django_capture_on_commit_callbacks(execute=True):
        for lease in single:
            lease_release(lease_id=lease.pk, now=over)
    with django_capture_on_commit_callbacks(execute=True):
        assert len(sweep_release(over)) == len(batch)

    assert summary(batch, t0) == summary(single, t0)
    keys = DiskKey.objects.filter(lease__in=single + batch)
    assert set(keys.values_list("state", flat=True)) == {DiskKey.State.DESTROYED}
    assert len({key.destruction_proof for key in keys}) == len(single) + len(batch)  # each its own receipt


def test_a_term_invoiced_before_is_not_billed_again_and_the_rest_of_the_batch_goes_on(two_copies):
    _, leases, t0, now = two_copies
    early = due(leases)[2]
    issued, created = renewal_invoice_issue(lease=early, now=now - timedelta(minutes=5))  # the customer's "extend"
    assert created

    read = due(leases)  # as two passes that selected the same due leases read them
    with transaction.atomic():
        made = renewal_invoices_create(read, now=now)
    assert [invoice.lease_id for invoice in made] == [lease.pk for lease in leases if lease.pk != early.pk]
    assert Invoice.objects.filter(lease=early, kind="renewal").get() == issued
    assert Notification.objects.filter(lease=early, kind="renewal_invoice").count() == 1

    with transaction.atomic():
        assert renewal_invoices_create(read, now=now) == []  # the second pass: every term already billed
    per_lease = [Invoice.objects.filter(lease=lease, kind="renewal").count() for lease in leases]
    assert per_lease == [1] * len(leases)
    assert LedgerEntry.objects.filter(kind="renewal", account__customer__username__startswith="batch").count() == 4


def test_one_lease_that_cannot_be_renewed_does_not_hold_back_its_batch(two_copies, monkeypatch, caplog):
    _, leases, t0, now = two_copies
    broken = leases[3]
    real_line = renewals._renewal_line

    def fails_for_one(lease):
        if lease.pk == broken.pk:
            raise ValueError("a lease the renewal cannot price")
        return real_line(lease)

    monkeypatch.setattr(renewals, "_renewal_line", fails_for_one)
    ids = {lease.pk for lease in leases}
    done = [t.lease_id for t in sweep_renewal_invoices(now) if t.lease_id in ids]  # (the other copy too)
    assert sorted(done) == sorted(ids - {broken.pk})
    assert not Invoice.objects.filter(lease=broken, kind="renewal").exists()
    assert f"renewal of lease #{broken.pk} failed" in caplog.text

    monkeypatch.setattr(renewals, "_renewal_line", real_line)
    assert [t.lease_id for t in sweep_renewal_invoices(now)] == [broken.pk]  # the next pass renews it
    assert sweep_renewal_invoices(now) == []
    per_lease = [Invoice.objects.filter(lease=lease, kind="renewal").count() for lease in leases]
    assert per_lease == [1] * len(leases)
    assert [LedgerEntry.objects.filter(invoice__lease=lease, kind="renewal").count() for lease in leases] == \
        [1, 0, 0, 1, 1, 0, 1]


# --- which renewals a balance pays when it covers only some --------------------------------

@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(offsets=st.lists(st.sampled_from([0, 0, 1, 2, 5]), min_size=2, max_size=4),
       covered=st.integers(0, 4), data=st.data())
def test_a_balance_pays_the_earliest_terms_first_whatever_order_the_leases_come_in(catalog, settings, offsets,
                                                                                   covered, data):
    """renewal_payment_order: the earliest term end first, ties by the older lease; the order of
    the batch (the database's row order, a caller's list) changes nothing."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    site = Site.objects.first()
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    with transaction.atomic():
        customer = new_customer("several", balance=len(offsets) * PRICE, now=t0)
        leases = []
        for hours in offsets:  # each paid at its order and started then: its term ends a week later
            lease, _ = order(customer, t0 + timedelta(hours=hours), site=site)
            sweep_provisioning(t0 + timedelta(hours=hours))
            leases.append(lease)
        assert len({lease.ends_at for lease in due(leases)}) == len(set(offsets))  # the terms end as drawn
        if covered:  # the orders took the first top-up: the balance now covers `covered` renewals
            balance_top_up(customer=customer, amount_cents=covered * PRICE, now=t0)
        rule = sorted(due(leases), key=lambda lease: (lease.ends_at, lease.pk))  # read before the renewals extend them
        shuffled = data.draw(st.permutations(due(leases)), label="the batch's order")

        made = renewal_invoices_create(shuffled, now=t0 + WEEK)

        paid = {invoice.lease_id for invoice in made if invoice.state == Invoice.State.PAID}
        assert paid == {lease.pk for lease in rule[:covered]}
        assert [invoice.lease_id for invoice in made] == [lease.pk for lease in shuffled]  # the caller's order kept
        transaction.set_rollback(True)
