"""Races on PostgreSQL with real threads, each on its own connection: the last card, five
free cards for five (and six) customers at once, a renewal payment against the suspend
sweep, two lifecycle passes at once, and a pass that dies half-way. Each must end like one clean run (DESIGN: "the database is the last line
of defence"). The crash test also runs on SQLite."""
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import Count, Sum
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice, LedgerEntry
from billing.services import invoice_pay_from_balance
from inventory.models import GpuSlot, Offer, Site, SlotAllocation
from inventory.services import SoldOut
from ops.lifecycle import run_lifecycle
from rental.models import Lease, LeaseEvent, LeaseState
from tests.billing.races import (
    PRICE,
    WEEK,
    build_due_leases,
    in_threads,
    order,
    postgres_only,
    scenario,
    summary,
)
from tests.conftest import ON_POSTGRES
from tests.factories import form_data, new_customer, order_url
from tests.otp import TwoFactorClient

S = LeaseState

pytestmark = pytest.mark.django_db(transaction=True)


# --- (a) the last card ------------------------------------------------------------------

@postgres_only
def test_twenty_customers_race_for_the_last_card(catalog):
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    slots = list(GpuSlot.objects.filter(node__site=site, node__gpu_model=offer.gpu_model, in_service=True))
    SlotAllocation.objects.bulk_create([SlotAllocation(slot=s, lease_id=10**9 + i) for i, s in enumerate(slots[1:])])
    customers = [new_customer(f"racer{i}") for i in range(20)]
    now = timezone.now()

    results = in_threads(*[lambda c=c: order(c, now, site=site, pay=False) for c in customers])

    won = [r for r in results if isinstance(r, tuple)]
    sold_out = [r for r in results if isinstance(r, SoldOut)]
    assert len(won) == 1 and len(sold_out) == 19, results
    assert Lease.objects.count() == 1 and Invoice.objects.count() == 1
    assert not Invoice.objects.filter(lease__isnull=True).exists()
    lease = won[0][0]
    assert SlotAllocation.objects.get(released_at__isnull=True, slot=slots[0]).lease_id == lease.pk
    doubled = (SlotAllocation.objects.filter(released_at__isnull=True).values("slot")
               .annotate(n=Count("id")).filter(n__gt=1))
    assert not doubled.exists()
    assert not LedgerEntry.objects.exists()  # nobody charged


def leave_free(n, offer, site):
    """Take every in-service card of `offer`'s model at `site` but `n` (held by leases that
    are not in this test); return the `n` left free."""
    slots = list(GpuSlot.objects.filter(node__site=site, node__gpu_model=offer.gpu_model, in_service=True)
                 .order_by("node_id", "index"))
    assert len(slots) > n
    SlotAllocation.objects.bulk_create([SlotAllocation(slot=s, lease_id=10**9 + i) for i, s in enumerate(slots[n:])])
    return slots[:n]


@postgres_only
def test_five_customers_at_once_get_the_five_free_cards(catalog):
    """The row lock's own job: orders that arrive together wait for each other instead of
    all choosing the same free card, so nobody is told "sold out" while cards are free."""
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    free = leave_free(5, offer, site)
    customers = [new_customer(f"five{i}", balance=PRICE) for i in range(5)]
    now = timezone.now()

    results = in_threads(*[lambda c=c: order(c, now, site=site) for c in customers])

    assert all(isinstance(r, tuple) for r in results), results
    held = SlotAllocation.objects.filter(released_at__isnull=True, lease_id__in=[r[0].pk for r in results])
    assert sorted(held.values_list("slot_id", flat=True)) == sorted(s.pk for s in free)
    assert Counter(Lease.objects.values_list("state", flat=True)) == {S.PROVISIONING: 5}
    assert LedgerEntry.objects.filter(kind="order").count() == 5


@postgres_only
def test_six_customers_at_once_on_the_order_page_for_five_cards(catalog):
    """Five get their lease; the sixth gets the page's "just sold out" answer (409), is
    charged nothing, and keeps the form to choose another site."""
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    leave_free(5, offer, site)
    customers = [new_customer(f"six{i}", balance=PRICE) for i in range(6)]

    def order_on_the_page(customer):
        browser = TwoFactorClient()
        browser.force_login(customer)
        return customer, browser.post(order_url(), form_data(pay_from_balance="on"))

    results = in_threads(*[lambda c=c: order_on_the_page(c) for c in customers])

    assert not [r for r in results if isinstance(r, BaseException)], results
    statuses = Counter(response.status_code for _, response in results)
    assert statuses == {302: 5, 409: 1}, statuses
    [(loser, page)] = [(c, r) for c, r in results if r.status_code == 409]
    assert "Just sold out — this card was taken a moment ago; nothing was charged" in page.content.decode()
    assert not Lease.objects.filter(customer=loser).exists()
    assert not LedgerEntry.objects.filter(account__customer=loser).exclude(kind="topup").exists()
    winners = [(c, r) for c, r in results if r.status_code == 302]
    for customer, response in winners:
        lease = Lease.objects.get(customer=customer)
        assert response["Location"] == reverse("lease_detail", args=[lease.pk])
        assert lease.state == S.PROVISIONING


# --- (b) a renewal payment racing the suspend sweep --------------------------------------

@postgres_only
def test_renewal_payment_racing_the_suspend_sweep(catalog, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    sites = list(Site.objects.all())
    rounds = 20
    leases = []
    for i in range(rounds):  # lease i ends one minute after lease i-1, so each round races one lease
        customer = new_customer(f"renter{i}", balance=2 * PRICE, auto_renew=False, now=t0)
        lease, _ = order(customer, t0 + timedelta(minutes=i), site=sites[i % len(sites)])
        leases.append(lease)
        run_lifecycle(t0 + timedelta(minutes=i))  # active: its term starts now
    run_lifecycle(t0 + WEEK - timedelta(hours=23))  # all renewal invoices, open (auto-renew off)
    assert Invoice.objects.filter(kind="renewal", state="open").count() == rounds

    outcomes = Counter()
    for i, lease in enumerate(leases):
        end = t0 + timedelta(minutes=i) + WEEK
        renewal = Invoice.objects.get(lease=lease, kind="renewal")
        now = end + timedelta(seconds=30)
        pay, sweep = in_threads(lambda: invoice_pay_from_balance(invoice=renewal, now=now),  # noqa: B023
                                lambda: run_lifecycle(now))  # noqa: B023
        assert not isinstance(pay, BaseException) and not isinstance(sweep, BaseException), (pay, sweep)
        lease.refresh_from_db()
        assert lease.state == S.ACTIVE, (i, list(lease.events.values_list("kind", flat=True)))
        assert lease.ends_at == end + WEEK and lease.hold_until is None
        assert LeaseEvent.objects.filter(lease=lease, kind="extended").count() == 1
        ledger = LedgerEntry.objects.filter(account__customer=lease.customer)
        assert ledger.filter(kind="renewal").count() == 1 and not ledger.filter(kind="late_payment").exists()
        assert ledger.aggregate(s=Sum("amount_cents"))["s"] == 0
        outcomes["sweep first" if lease.events.filter(kind="suspended").exists() else "payment first"] += 1
    print("race outcomes:", dict(outcomes))


# --- (c) two lifecycle passes at once --------------------------------------------------------


@postgres_only
def test_two_lifecycle_passes_at_once_transition_each_lease_once(catalog, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    build_due_leases(50, t0, prefix="due")
    run_lifecycle(t0)  # all active, their terms end at t0 + WEEK
    now = t0 + WEEK + timedelta(minutes=1)  # renewal (half paid), other half suspended

    first, second = in_threads(lambda: run_lifecycle(now), lambda: run_lifecycle(now))
    assert not isinstance(first, BaseException) and not isinstance(second, BaseException), (first, second)
    # renewal invoices, suspended, and one suspension notice per suspended lease
    assert len(first) + len(second) == 50 + 25 + 25

    kinds = Counter(LeaseEvent.objects.values_list("kind", flat=True))
    assert kinds == Counter({"created": 50, "paid": 50, "provisioned": 50, "extended": 25, "suspended": 25})
    per_lease = Invoice.objects.filter(kind="renewal").values("lease").annotate(n=Count("id"))
    assert len(per_lease) == 50 and all(row["n"] == 1 for row in per_lease)
    assert LedgerEntry.objects.filter(kind="renewal").count() == 25
    assert Counter(Lease.objects.values_list("state", flat=True)) == {S.ACTIVE: 25, S.SUSPENDED: 25}
    assert run_lifecycle(now) == []  # and a third pass has nothing left to do


# --- (d) a pass that dies half-way, then the next pass ---------------------------------------


CRASH_POINTS = [  # (where the worker dies, on which call, in which of the scenario's passes)
    ("rental.lifecycle.lease_provisioned", 7, 0),  # while provisioning
    ("billing.renewals.invoices_pay_from_balance", 1, 1),  # inside the renewals' transaction: rolled back
    ("rental.lifecycle.leases_suspend", 1, 1),  # the batch of suspensions (one transaction) rolls back
    ("rental.services.disk_keys_request_destroy", 1, 2),  # inside a release (rental.services calls it): rolled back
    ("rental.disk_keys.disk_keys_complete_destroy", 1, 2),  # between the two phases of key destruction
]


@pytest.mark.parametrize("target,k,crash_pass", CRASH_POINTS)
def test_pass_killed_mid_way_then_rerun_equals_one_clean_run(catalog, settings, monkeypatch, target, k,
                                                              crash_pass):
    settings.HOST_AGENT_FAKE_DELAY = 0
    t_clean = timezone.now().replace(microsecond=0) - timedelta(days=60)
    t_crash = t_clean + timedelta(days=400)  # far apart: a pass over one copy never touches the other

    clean, clean_passes = scenario(t_clean, "clean")
    after_pass = []
    for at in clean_passes:
        assert run_lifecycle(at)
        after_pass.append(summary(clean, t_clean))
    assert Counter(row[0] for row in after_pass[1]) == {S.ACTIVE: 10, S.SUSPENDED: 20}
    assert Counter(row[0] for row in after_pass[2]) == {S.ACTIVE: 10, S.WIPED: 20}
    expected = after_pass[crash_pass]

    crashed, crash_passes = scenario(t_crash, "crash")
    for at in crash_passes[:crash_pass]:
        run_lifecycle(at)
    crash_now = crash_passes[crash_pass]
    module_name, attr = target.rsplit(".", 1)
    module = __import__(module_name, fromlist=[attr])
    real, calls = getattr(module, attr), Counter()

    def dies_on_kth_call(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == k:
            raise SystemExit(f"worker killed in {attr}")  # not an Exception: nothing may swallow it
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attr, dies_on_kth_call)
    [died] = in_threads(lambda: run_lifecycle(crash_now)) if ON_POSTGRES else [_call(run_lifecycle, crash_now)]
    assert isinstance(died, SystemExit), died
    monkeypatch.setattr(module, attr, real)
    partial = summary(crashed, t_crash)
    assert partial != expected  # the crash really left work undone

    run_lifecycle(crash_now)
    assert summary(crashed, t_crash) == expected
    assert run_lifecycle(crash_now) == []
    for at in crash_passes[crash_pass + 1:]:
        run_lifecycle(at)
    assert summary(crashed, t_crash) == after_pass[-1]


def _call(fn, *args):
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: B036
        return exc
