"""SLA credits: each band, the boundaries, clipping to the month and to paid time,
overlapping downtime counted once, the 30-day claim window, and never a double credit."""
from datetime import UTC, date, datetime, timedelta

import pytest
from django.urls import reverse

from billing.models import Account, LedgerEntry, SlaClaim
from billing.sla.services import (
    ClaimRefused,
    claimable_periods,
    sla_claim_approve,
    sla_claim_decline,
    sla_claim_file,
    sla_figures,
)
from inventory.incidents import incident_open
from inventory.models import SlotAllocation

APRIL = date(2025, 4, 1)  # 30 days: a month-term lease paid on April 1st covers it exactly
START = datetime(2025, 4, 1, tzinfo=UTC)
MAY = datetime(2025, 5, 1, tzinfo=UTC)
PRICE = 99_000  # A100 SXM, month


@pytest.fixture
def lease(catalog, customer, place):
    return place(customer, START, offer="a100-sxm", term="month")


def outage(lease, start, minutes, **kw):
    slot = SlotAllocation.objects.filter(lease_id=lease.pk).first().slot
    scope = kw.pop("scope", "node")
    target = {"node": slot.node} if scope == "node" else {"slot": slot}
    return incident_open(starts_at=start, ends_at=start + timedelta(minutes=minutes), reason="test", **target, **kw)


def balance(customer):
    return Account.objects.get(customer=customer).balance_cents


@pytest.mark.parametrize("minutes, credit, band", [
    (40, 0, "no credit"),                       # 99.907%
    (43.2, 0, "no credit"),                     # exactly 99.9%: not below
    (60, 3 * 138, "3×"),                        # 99.861%: value ceil(99000 × 3600 / 2592000) = 138
    (8 * 60, 10 * 1100, "10×"),                 # 98.889%: value 1100
    (36 * 60, 10 * 4950, "10×"),                # exactly 95%: not below it, so 10× value 4950 = 49,500
    (40 * 60, 99_000, "whole month"),           # 94.4%: the whole month
])
def test_bands(lease, minutes, credit, band):
    outage(lease, START + timedelta(days=10), minutes)
    figures = sla_figures(lease=lease, period=APRIL, now=MAY)
    assert figures.paid_seconds == 30 * 86400
    assert figures.credit_cents == credit
    assert band in figures.band


def test_whole_month_band_credits_the_months_price(lease, customer):
    outage(lease, START + timedelta(days=3), 40 * 60)
    claim = sla_claim_file(customer=customer, lease=lease, period=APRIL, message="down two days", now=MAY)
    assert claim.credit_cents == PRICE and str(claim.availability_pct) == "94.4444"
    sla_claim_approve(claim=claim, actor=None, now=MAY + timedelta(days=1))
    assert balance(customer) == PRICE


def test_clipped_to_month_and_overlaps_counted_once(lease):
    # 2 h across the month's end: 1 h in April. A GPU incident inside the node's: counted once.
    outage(lease, MAY - timedelta(hours=1), 120)
    outage(lease, START + timedelta(days=2), 30)
    outage(lease, START + timedelta(days=2, minutes=10), 10, scope="slot")
    f = sla_figures(lease=lease, period=APRIL, now=MAY + timedelta(days=2))
    assert f.downtime_seconds == 90 * 60
    assert f.credit_cents == 3 * -(-PRICE * 90 * 60 // (30 * 86400))


def test_clipped_to_paid_time(catalog, customer, place):
    mid = START + timedelta(days=15)
    lease = place(customer, mid, offer="a100-sxm", term="month")
    outage(lease, mid + timedelta(days=1), 60)
    f = sla_figures(lease=lease, period=APRIL, now=MAY)
    assert f.paid_seconds == 15 * 86400
    # 1 h of 15 days = 99.72%: 3× the hour's value.
    assert f.multiplier == 3 and f.credit_cents == 3 * -(-PRICE * 3600 // (30 * 86400))


def test_degraded_not_credited_unless_configured(lease, settings):
    outage(lease, START + timedelta(days=1), 600, kind="degraded")
    assert sla_figures(lease=lease, period=APRIL, now=MAY).credit_cents == 0
    settings.SLA_COUNT_DEGRADED = True
    assert sla_figures(lease=lease, period=APRIL, now=MAY).multiplier == 10


def test_claim_window(lease, customer, other_customer):
    outage(lease, START + timedelta(days=10), 60)
    with pytest.raises(ClaimRefused, match="has not ended"):
        sla_claim_file(customer=customer, lease=lease, period=APRIL, message="", now=START + timedelta(days=20))
    with pytest.raises(ClaimRefused, match="closed on 2025-05-31"):
        sla_claim_file(customer=customer, lease=lease, period=APRIL, message="", now=MAY + timedelta(days=30, seconds=1))
    with pytest.raises(ClaimRefused, match="not yours"):
        sla_claim_file(customer=other_customer, lease=lease, period=APRIL, message="", now=MAY)
    claim = sla_claim_file(customer=customer, lease=lease, period=APRIL, message="", now=MAY + timedelta(days=30))
    assert claim.credit_cents == 414
    with pytest.raises(ClaimRefused, match="already pending"):
        sla_claim_file(customer=customer, lease=lease, period=APRIL, message="again", now=MAY + timedelta(days=30))
    assert claimable_periods(now=MAY + timedelta(days=5)) == [APRIL]
    assert claimable_periods(now=MAY + timedelta(days=31)) == [date(2025, 5, 1)]  # April closed


def test_never_credited_twice(lease, customer, operator):
    outage(lease, START + timedelta(days=10), 60)
    claim = sla_claim_file(customer=customer, lease=lease, period=APRIL, message="", now=MAY)
    approved = sla_claim_approve(claim=claim, actor=operator, now=MAY + timedelta(days=1))
    assert approved.state == "approved" and approved.credit_cents == 414 and approved.ledger_entry.amount_cents == 414
    assert balance(customer) == 414
    with pytest.raises(ClaimRefused, match="already approved"):
        sla_claim_approve(claim=claim, actor=operator, now=MAY + timedelta(days=1))
    with pytest.raises(ClaimRefused, match="already credited"):
        sla_claim_file(customer=customer, lease=lease, period=APRIL, message="", now=MAY + timedelta(days=2))
    # A second claim that slipped in (two tabs, a race): approving it credits nothing.
    twin = SlaClaim.objects.create(lease=lease, customer=customer, period=APRIL, created_at=MAY)
    twin = sla_claim_approve(claim=twin, actor=operator, now=MAY + timedelta(days=2))
    assert twin.state == "declined" and "never credited twice" in twin.decision_reason
    assert balance(customer) == 414
    assert LedgerEntry.objects.filter(kind="sla_credit").count() == 1
    assert LedgerEntry.objects.get(kind="sla_credit").idempotency_key == f"sla:{lease.pk}:2025-04"


def test_approval_without_credit_refused_and_decline_needs_reason(lease, customer, operator):
    claim = sla_claim_file(customer=customer, lease=lease, period=APRIL, message="felt slow", now=MAY)
    assert claim.credit_cents == 0
    with pytest.raises(ClaimRefused, match="no credit is due"):
        sla_claim_approve(claim=claim, actor=operator, now=MAY)
    with pytest.raises(ClaimRefused, match="reason"):
        sla_claim_decline(claim=claim, actor=operator, reason=" ", now=MAY)
    claim = sla_claim_decline(claim=claim, actor=operator, reason="No recorded downtime.", now=MAY)
    assert claim.state == "declined" and claim.decided_by == operator


@pytest.mark.urls("tests.ops.urls")
def test_customer_files_a_claim_on_the_page(catalog, customer, place, client, monkeypatch):
    from types import SimpleNamespace

    from django.utils import timezone

    from billing.sla import views
    today = timezone.now()
    # The page's clock, pinned mid-month: on a 31st last month ended over 30 days ago and no
    # month is claimable at all (CLAIM_WINDOW), so the page would offer nothing.
    now = datetime(today.year, today.month, 10, 12, tzinfo=UTC)
    monkeypatch.setattr(views, "timezone", SimpleNamespace(now=lambda: now, datetime=timezone.datetime))
    last_month = (now.replace(day=1) - timedelta(days=1)).replace(day=1)
    start = datetime(last_month.year, last_month.month, 1, tzinfo=UTC)
    lease = place(customer, start, offer="a100-sxm", term="month")
    outage(lease, start + timedelta(days=2), 8 * 60)
    client.force_login(customer)
    page = client.get(reverse("sla:claims"))
    assert page.status_code == 200 and f"{last_month:%Y-%m}" in page.content.decode()
    response = client.post(reverse("sla:claims"), {"lease": lease.pk, "period": f"{last_month:%Y-%m}",
                                                   "message": "node died"}, follow=True)
    claim = SlaClaim.objects.get()
    assert claim.credit_cents == 10 * 1100 and claim.message == "node died"
    assert f"Claim #{claim.pk} filed" in response.content.decode()


def test_operator_approves_in_admin(lease, customer, op_client):
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
    outage(lease, START + timedelta(days=10), 60)
    claim = sla_claim_file(customer=customer, lease=lease, period=APRIL, message="", now=MAY)
    url = reverse("admin:billing_slaclaim_changelist")
    page = op_client.post(url, {"action": "approve", ACTION_CHECKBOX_NAME: [claim.pk]})
    assert "3× the downtime" in page.content.decode() and "$4.14" in page.content.decode()
    done = op_client.post(url, {"action": "approve", ACTION_CHECKBOX_NAME: [claim.pk], "post": "yes", "reason": ""},
                          follow=True)
    assert "$4.14 credited" in done.content.decode()
    assert balance(customer) == 414
    assert op_client.get(reverse("admin:billing_slaclaim_change", args=[claim.pk])).status_code == 200
