"""The operators' dashboard: every figure checked against a known fixture, a constant
number of queries, and a late beat raised as an alert."""
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from billing.models import Invoice, JobRun, Payment, Quote
from inventory.incidents import incident_open
from inventory.models import GpuSlot, SlotAllocation
from ops.backoffice.dashboard import dashboard
from rental.services import lease_release, lease_suspend

NOW = datetime(2025, 6, 15, 12, 0, tzinfo=UTC)


def quote(customer, *, state, first_seen, created):
    invoice = Invoice.objects.create(customer=customer, kind="topup", amount_cents=1000, created_at=created)
    q = Quote.objects.create(invoice=invoice, coin="LTC", address=f"ltc1q{created.timestamp():.0f}", amount=1000,
                             usd_cents=1000, rate_usd_per_coin=Decimal("80"), rate_source="operator", rate_at=created,
                             uri="litecoin:x", created_at=created, expires_at=created + timedelta(minutes=30),
                             state=state)
    if first_seen:
        Payment.objects.create(quote=q, coin="LTC", txid=f"{q.pk:064x}", output_index=0, address=q.address,
                               amount=1000, first_seen_at=first_seen)
    return q


@pytest.fixture
def world(catalog, customer, other_customer, place):
    w = {}
    w["active"] = place(customer, NOW - timedelta(hours=1), term="week")                 # June 15, ends in 7 d
    w["due24"] = place(customer, NOW - timedelta(days=6, hours=12), term="week")         # June 8, ends in 12 h
    w["due72"] = place(other_customer, NOW - timedelta(days=5), term="week")             # June 10, ends in 2 d
    w["suspended"] = place(customer, NOW - timedelta(days=8), term="week")               # June 7, ended yesterday
    assert lease_suspend(lease_id=w["suspended"].pk, now=NOW)
    w["released"] = place(customer, NOW - timedelta(days=12), term="week")               # June 3
    assert lease_suspend(lease_id=w["released"].pk, now=NOW - timedelta(days=5))
    assert lease_release(lease_id=w["released"].pk, now=NOW)  # key: destroy requested (phase 2 runs on commit)
    w["old"] = place(other_customer, datetime(2025, 5, 20, tzinfo=UTC), term="week")    # May: not this month's
    assert lease_suspend(lease_id=w["old"].pk, now=datetime(2025, 5, 27, tzinfo=UTC))
    assert lease_release(lease_id=w["old"].pk, now=datetime(2025, 5, 30, tzinfo=UTC))  # wipe by June 3: overdue
    w["pending"] = place(other_customer, NOW - timedelta(minutes=5), term="week", activate=False)
    Invoice.objects.filter(lease=w["pending"]).update(state="open", paid_at=None)  # not paid
    from billing.models import LedgerEntry
    LedgerEntry.objects.filter(invoice__lease=w["pending"]).delete()  # ... so nothing was spent on it either
    from rental.models import Lease
    Lease.objects.filter(pk=w["pending"].pk).update(state="pending", started_at=None, ends_at=None)
    # One free DFW-1 RTX 3090 goes down.
    taken = SlotAllocation.objects.filter(released_at__isnull=True).values("slot_id")
    w["down_slot"] = GpuSlot.objects.filter(node__site__code="DFW-1", node__gpu_model__slug="rtx-3090").exclude(
        pk__in=taken).first()
    incident_open(slot=w["down_slot"], starts_at=NOW - timedelta(minutes=30), reason="ECC", now=NOW)
    # Jobs: the lifecycle beat ran 4 minutes ago (late); a watcher ran a minute ago.
    JobRun.objects.create(name="lifecycle", last_started_at=NOW - timedelta(minutes=4),
                          last_finished_at=NOW - timedelta(minutes=4), last_result={"transitions": 0})
    JobRun.objects.create(name="watch_ltc", last_started_at=NOW - timedelta(minutes=1),
                          last_finished_at=NOW - timedelta(seconds=50))
    w["stuck"] = quote(customer, state="processing", first_seen=NOW - timedelta(hours=2), created=NOW - timedelta(hours=3))
    quote(customer, state="processing", first_seen=NOW - timedelta(minutes=10), created=NOW - timedelta(minutes=20))
    quote(customer, state="new", first_seen=None, created=NOW - timedelta(hours=5))
    return w


def test_figures_match_the_fixture(world, django_assert_max_num_queries):
    with django_assert_max_num_queries(19):  # + net revenue (ledger, outside) and per site, coin health, reviews, tokens, wallets,
        # the price guard, the renewal check and the invoices of the leases it flags
        board = dashboard(NOW)
        board.alerts  # noqa: B018 — everything evaluated inside the block

    rows = {(r.site, r.model): r for r in board.capacity}
    dfw = rows[("DFW-1", "RTX 3090")]
    total = GpuSlot.objects.filter(node__site__code="DFW-1", node__gpu_model__slug="rtx-3090").count()
    # active, due24, due72 and the pending order hold slots; the suspended lease's slot is held.
    assert (dfw.leased, dfw.held, dfw.down, dfw.draining) == (4, 1, 1, 0)
    assert dfw.free == total - 6 and dfw.total == total
    assert sum(r.total for r in board.capacity) == GpuSlot.objects.count()
    assert rows[("IAD-1", "RTX 3090")].leased == 0

    # June's paid orders: active, due24, due72, suspended, released (June 3) = 5 × $65; May's is not counted.
    assert board.revenue == {"cents": 5 * 6500, "invoices": 5, "since": datetime(2025, 6, 1, tzinfo=UTC),
                             "spent_from_balance_cents": 5 * 6500, "paid_outside_cents": 0,
                             "refunds_cents": 0, "sla_credits_cents": 0, "net_cents": 5 * 6500}
    assert (board.renewals["due_24h"], board.renewals["due_72h"]) == (1, 2)
    assert [x.pk for x in board.renewals["leases"]] == [world["due24"].pk, world["due72"].pk]
    assert board.renewals["unpaid_24h"] == 1

    assert [x.pk for x in board.suspended] == [world["suspended"].pk]
    assert board.suspended[0].hold_until == NOW + timedelta(hours=72)  # from the stop
    assert {k.lease_id for k in board.keys_pending} == {world["released"].pk, world["old"].pk}
    assert [x.pk for x in board.wipes["overdue"]] == [world["old"].pk] and board.wipes["next_24h"] == []
    assert [q.pk for q in board.quotes_stuck] == [world["stuck"].pk]

    jobs = {j.name: j for j in board.jobs}
    assert jobs["lifecycle"].alert.startswith("late: last completed 4 min ago")
    assert (jobs["lifecycle"].age_text, jobs["lifecycle"].allowed_text) == ("240 s", "180 s")
    assert jobs["watch_ltc"].alert == "" and jobs["watch_ltc"].age_text == "50 s"  # not scheduled: its age only
    assert "Job lifecycle: late: last completed 4 min ago (expected within 3 min)" in board.alerts
    assert "1 quote(s) stuck in processing for over an hour" in board.alerts


def test_query_count_does_not_grow_with_rows(world, customer, place, django_assert_max_num_queries):
    for _ in range(5):
        place(customer, NOW - timedelta(hours=2), term="week")
    with django_assert_max_num_queries(19):  # + net revenue (ledger, outside) and per site, coin health, reviews, tokens, wallets,
        # the price guard, the renewal check and the invoices of the leases it flags
        dashboard(NOW).alerts  # noqa: B018


def test_revenue_is_net_of_refunds_and_sla_credits(world, customer):
    from billing.models import LedgerEntry
    from billing.services import ledger_post

    ledger_post(customer=customer, kind=LedgerEntry.Kind.REFUND, amount_cents=6500, now=NOW - timedelta(hours=1))
    ledger_post(customer=customer, kind=LedgerEntry.Kind.SLA_CREDIT, amount_cents=123, now=NOW - timedelta(hours=1))
    ledger_post(customer=customer, kind=LedgerEntry.Kind.REFUND, amount_cents=999, now=datetime(2025, 5, 20, tzinfo=UTC))
    revenue = dashboard(NOW).revenue
    assert (revenue["refunds_cents"], revenue["sla_credits_cents"]) == (6500, 123)  # May's refund is not June's
    assert revenue["net_cents"] == 5 * 6500 - 6500 - 123


def test_a_beat_that_stopped_shows_within_minutes(db, settings):
    t = datetime(2025, 6, 15, 12, 0, tzinfo=UTC)
    JobRun.objects.create(name="lifecycle", last_started_at=t, last_finished_at=t + timedelta(seconds=2))
    # Three intervals (JOB_STALE_AFTER_INTERVALS) after the last completed pass.
    assert [j.alert for j in dashboard(t + timedelta(minutes=3, seconds=1)).jobs if j.name == "lifecycle"] == [""]
    late = dashboard(t + timedelta(minutes=3, seconds=3))
    assert any(a.startswith("Job lifecycle: late") for a in late.alerts)
    settings.CELERY_BEAT_SCHEDULE = {**settings.CELERY_BEAT_SCHEDULE, "coin_watch": {"task": "x", "schedule": 30}}
    assert "Job coin_watch: never ran: is celery beat running?" in dashboard(t).alerts
    # A job that started and never finished (a worker killed mid-run).
    JobRun.objects.filter(name="lifecycle").update(last_started_at=t + timedelta(minutes=1), last_finished_at=t)
    assert [j.alert for j in dashboard(t + timedelta(minutes=4, seconds=30)).jobs if j.name == "lifecycle"] == [
        "started 3 min ago and has not finished (worker stuck or killed?)"]


def test_dashboard_page_is_staff_only_and_linked_from_the_index(world, op_client, customer):
    from django.test import Client
    url = reverse("admin:ops_dashboard")
    assert url == "/admin/ops/dashboard/"
    visitor = Client()
    visitor.force_login(customer)
    assert visitor.get(url).status_code == 302  # to the admin login
    index = op_client.get(reverse("admin:index")).content.decode()
    assert url in index and reverse("admin:ops_exports") in index
    page = op_client.get(url)
    assert page.status_code == 200
    text = page.content.decode()
    assert "Operations dashboard" in text and "RTX 3090" in text and "stuck in processing" in text
