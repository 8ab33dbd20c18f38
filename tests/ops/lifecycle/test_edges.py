"""The lifecycle at its edges: late beats, the boundaries of every timer, the
deadlines customers are shown against the moments the sweeps act, and a simulated clock
that reaches every write of a pass."""
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice
from billing.refunds import lease_refund
from billing.services import BillingError, balance_top_up, checkout_place_order
from inventory.models import Offer, Site, SlotAllocation
from ops.lifecycle import run_lifecycle, sweep_renewal_invoices
from rental import lifecycle as sweeps
from rental.accounts.services import api_token_create
from rental.models import DiskKey, Image, Lease, LeaseEvent, LeaseState, Notification

S = LeaseState
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
SECOND = timedelta(seconds=1)


@pytest.fixture
def t0():
    return timezone.now().replace(microsecond=0) - timedelta(days=1)


def order(customer, at, *, pay=True):
    if pay:
        balance_top_up(customer=customer, amount_cents=6500, now=at)
    lease, invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="DFW-1"),
        term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
        pay_from_balance=pay, now=at)
    return lease


def active(customer, at, settings):
    """A week lease paid and provisioned at `at` (its term ends at + 7 days)."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    lease = order(customer, at)
    assert sweeps.sweep_provisioning(at)
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE and lease.ends_at == at + timedelta(days=7)
    return lease


def kinds(lease) -> list[str]:
    return list(Notification.objects.filter(lease=lease).order_by("created_at", "id").values_list("kind", flat=True))


# --- late beats -------------------------------------------------------------------------------

def test_five_day_outage_suspends_with_the_full_hold_and_a_notice_never_releases_in_the_same_pass(
        catalog, customer, t0, settings):
    lease = active(customer, t0, settings)
    end = lease.ends_at
    back = end + timedelta(days=5)  # no beat from before the reminders until five days after the end

    run_lifecycle(back)
    lease.refresh_from_db()
    assert lease.state == S.SUSPENDED and lease.suspended_at == back
    assert lease.hold_until == back + timedelta(hours=72)  # the full hold, from the actual stop
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.ACTIVE
    notice = Notification.objects.get(lease=lease, kind="suspended")
    assert f"{lease.hold_until:%Y-%m-%d %H:%M}" in notice.body and notice.created_at == back
    # The term had ended: the missed reminders are replaced by the suspension notice.
    assert kinds(lease) == ["renewal_invoice", "suspended"]

    run_lifecycle(lease.hold_until - SECOND)
    assert Lease.objects.get(pk=lease.pk).state == S.SUSPENDED
    run_lifecycle(lease.hold_until)
    assert Lease.objects.get(pk=lease.pk).state == S.WIPED
    assert list(LeaseEvent.objects.filter(lease=lease).values_list("kind", flat=True)) == [
        "created", "paid", "provisioned", "suspended", "released", "key_destroy_requested", "key_destroyed", "wiped"]


def test_missed_reminder_is_sent_late_and_only_the_most_urgent_one(catalog, customer, t0, settings):
    lease = active(customer, t0, settings)
    end = lease.ends_at
    back = end - timedelta(hours=2)  # both the 3-day and the 1-day reminder were missed
    assert [t.what for t in sweeps.sweep_reminders(back)] == ["reminder_1d"]
    assert sweeps.sweep_reminders(back + timedelta(minutes=1)) == []
    assert kinds(lease) == ["reminder_1d"]
    note = Notification.objects.get(lease=lease)
    assert note.deadline == end and note.created_at == back


def test_late_3_day_reminder_is_sent_while_the_1_day_one_is_not_due(catalog, customer, t0, settings):
    lease = active(customer, t0, settings)
    back = lease.ends_at - timedelta(hours=30)  # the 3-day reminder's moment passed 42 h ago
    assert [t.what for t in sweeps.sweep_reminders(back)] == ["reminder_3d"]
    assert [t.what for t in sweeps.sweep_reminders(lease.ends_at - timedelta(hours=24))] == ["reminder_1d"]


def test_order_paid_during_an_outage_starts_its_term_when_provisioned(catalog, customer, t0, settings):
    settings.HOST_AGENT_FAKE_DELAY = 180
    lease = order(customer, t0)
    lease.refresh_from_db()
    assert lease.state == S.PROVISIONING and lease.started_at is None and lease.ends_at is None
    # No renewal invoice for a lease whose term has not started, however late it is.
    assert sweep_renewal_invoices(t0 + timedelta(days=30)) == []
    ready = t0 + timedelta(days=2)  # the beat was down for two days
    run_lifecycle(ready)
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE and lease.started_at == ready and lease.ends_at == ready + timedelta(days=7)
    assert not Invoice.objects.filter(lease=lease, kind="renewal").exists()


# --- boundaries -------------------------------------------------------------------------------

def test_refund_at_exactly_the_window_is_refused_a_second_before_allowed(catalog, customer, t0):
    on_time, late = order(customer, t0), order(customer, t0)
    assert lease_refund(lease=on_time, actor=customer, now=t0 + timedelta(minutes=59, seconds=59)) == 6500
    with pytest.raises(BillingError, match="within 60 minutes"):
        lease_refund(lease=late, actor=customer, now=t0 + timedelta(minutes=60))
    assert Lease.objects.get(pk=late.pk).state == S.PROVISIONING


def test_renewal_invoice_not_at_t_minus_25_h_but_at_t_minus_24_h(catalog, customer, t0, settings):
    lease = active(customer, t0, settings)
    end = lease.ends_at
    assert sweep_renewal_invoices(end - timedelta(hours=25)) == []
    assert sweep_renewal_invoices(end - timedelta(hours=24) - SECOND) == []
    assert len(sweep_renewal_invoices(end - timedelta(hours=24))) == 1
    assert Invoice.objects.get(lease=lease, kind="renewal").term_start == end


def test_hold_ends_at_exactly_72_h_after_the_stop(catalog, customer, t0, settings):
    lease = active(customer, t0, settings)
    stop = lease.ends_at
    assert sweeps.sweep_suspend(stop - SECOND) == []
    assert len(sweeps.sweep_suspend(stop)) == 1
    assert sweeps.sweep_release(stop + timedelta(hours=72) - SECOND) == []
    assert len(sweeps.sweep_release(stop + timedelta(hours=72))) == 1
    assert Lease.objects.get(pk=lease.pk).ended_at == stop + timedelta(hours=72)


# --- what customers are shown is when the sweeps act ---------------------------------------------

TIMERS = {
    "spec defaults": {},
    "operator's own": {"LEASE_REFUND_WINDOW_MINUTES": 15, "LEASE_REMINDER_LEAD_HOURS": [48, 6],
                       "LEASE_RENEWAL_LEAD_HOURS": 12, "LEASE_HOLD_HOURS": 5},
}


def page_deadlines(client, lease) -> dict[str, str]:
    """The lease page's timeline list: label → ISO moment, plus the refund deadline."""
    html = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    shown = dict((label.strip(), at) for label, at in re.findall(
        r'<span class="tl-num">\d+</span>\s*(.*?)\s*—\s*<time datetime="([^"]+)"', html))
    if refund := re.search(r'data-refund-until="([^"]+)"', html):
        shown["refund"] = refund.group(1)
    return shown


def api_lease(client, token, lease) -> dict:
    return client.get(reverse("api_lease", args=[lease.pk]), HTTP_AUTHORIZATION=f"Bearer {token}").json()


def acts_exactly_at(sweep, at_iso: str) -> None:
    at = timezone.datetime.fromisoformat(at_iso)
    assert sweep(at - SECOND) == [], at_iso
    assert sweep(at), at_iso


@pytest.mark.parametrize("timers", TIMERS.values(), ids=TIMERS.keys())
def test_deadlines_shown_on_the_page_and_api_are_the_moments_the_sweeps_act(
        catalog, customer, client, settings, timers):
    for name, value in timers.items():
        setattr(settings, name, value)
    settings.HOST_AGENT_FAKE_DELAY = 0
    now = timezone.now().replace(microsecond=0)
    lease = order(customer, now)
    sweeps.sweep_provisioning(now)
    token = api_token_create(customer=customer, name="t")[1]
    client.force_login(customer)

    api, page = api_lease(client, token, lease), page_deadlines(client, lease)
    refund_until = timezone.datetime.fromisoformat(api["refund_until"])
    assert page["refund"] == api["refund_until"]
    with pytest.raises(BillingError):
        lease_refund(lease=Lease.objects.get(pk=lease.pk), actor=customer, now=refund_until)

    reminders = [(label, at) for label, at in page.items() if label.startswith("Reminder:")]
    assert len(reminders) == len(settings.LEASE_REMINDER_LEAD_HOURS)
    for _label, at in sorted(reminders, key=lambda item: item[1]):
        acts_exactly_at(sweeps.sweep_reminders, at)
    renewal = next(at for label, at in page.items() if label.startswith("Renewal invoice issued"))
    assert renewal == api["renewal_invoice_at"]
    acts_exactly_at(sweep_renewal_invoices, api["renewal_invoice_at"])
    term_end = next(at for label, at in page.items() if label.startswith("Term ends"))
    assert term_end == api["ends_at"]
    acts_exactly_at(sweeps.sweep_suspend, api["ends_at"])

    api, page = api_lease(client, token, lease), page_deadlines(client, lease)
    hold_end = next(at for label, at in page.items() if label.startswith("Hold ends"))
    assert hold_end == api["hold_until"]
    acts_exactly_at(sweeps.sweep_release, api["hold_until"])


# --- the simulated clock reaches every write ---------------------------------------------------

def test_a_pass_never_reads_the_wall_clock(catalog, customer, t0, settings, monkeypatch,
                                           django_capture_on_commit_callbacks):
    """A whole life, one pass per step, with timezone.now() made to explode: every timestamp
    a sweep writes comes from the pass's `now` (what `manage.py lifecycle --at` relies on)."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    lease = order(customer, t0)

    def wall_clock():
        raise AssertionError("a sweep read the wall clock")

    monkeypatch.setattr(timezone, "now", wall_clock)
    end = t0 + timedelta(days=7)
    for at in (t0, end - timedelta(days=3), end - timedelta(days=1), end, end + timedelta(hours=72)):
        with django_capture_on_commit_callbacks(execute=True):
            run_lifecycle(at)
    monkeypatch.undo()
    lease.refresh_from_db()
    assert lease.state == S.WIPED


def test_lifecycle_command_at_writes_the_simulated_time(catalog, customer, settings):
    settings.DEBUG = True  # --at without --dry-run
    settings.HOST_AGENT_FAKE_DELAY = 0
    lease = order(customer, timezone.now().replace(microsecond=0))
    future = timezone.now().replace(microsecond=0) + timedelta(days=400)
    stop = future - timedelta(hours=72)
    for at in (future - timedelta(days=300), stop, future):  # provisioned; suspended; released
        call_command("lifecycle", "--at", at.isoformat(), stdout=StringIO())
    lease.refresh_from_db()
    key = DiskKey.objects.get(lease=lease)
    assert lease.state == S.WIPED and lease.suspended_at == stop and lease.ended_at == future
    assert key.destroy_requested_at == future and key.destroyed_at == future
    assert set(SlotAllocation.objects.filter(lease_id=lease.pk).values_list("released_at", flat=True)) == {future}
    assert Notification.objects.get(lease=lease, kind="released").created_at == future
    assert Notification.objects.get(lease=lease, kind="suspended").created_at == stop
