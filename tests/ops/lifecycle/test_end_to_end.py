"""The lease lifecycle end to end with a moving clock, and its idempotency."""
from datetime import timedelta

import pytest
from django.utils import timezone, translation

from billing.models import Account, Invoice, LedgerEntry
from billing.refunds import lease_refund
from billing.services import BillingError, balance_top_up, invoice_mark_paid
from inventory.models import SlotAllocation
from ops.lifecycle import run_lifecycle
from rental.models import DiskKey, Lease, LeaseEvent, LeaseState, Notification
from tests.factories import order

S = LeaseState


@pytest.fixture
def t0():
    return timezone.now().replace(microsecond=0)


def state(lease):
    lease.refresh_from_db()
    return lease.state


def live_slots(lease):
    return SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).count()


def test_order_pay_from_balance_provision_remind_renew_suspend_resume(catalog, customer, t0, settings):
    settings.HOST_AGENT_FAKE_DELAY = 180
    balance_top_up(customer=customer, amount_cents=10_000, now=t0)
    lease, invoice = order(customer, t0)
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.PAID and invoice.amount_cents == 6500
    assert state(lease) == S.PROVISIONING and lease.ends_at is None  # the term starts when it is ready
    assert Account.objects.get(customer=customer).balance_cents == 3500

    run_lifecycle(t0 + timedelta(seconds=60))
    assert state(lease) == S.PROVISIONING  # the fake agent needs 3 minutes
    ready = t0 + timedelta(minutes=3)
    run_lifecycle(ready)
    assert state(lease) == S.ACTIVE and lease.ssh_command.startswith("ssh -p ")
    assert lease.started_at == ready and lease.ends_at == ready + timedelta(days=7)
    t0 = ready  # the term's clock from here on

    run_lifecycle(t0 + timedelta(days=4, hours=1))
    assert set(Notification.objects.filter(lease=lease).values_list("kind", flat=True)) == {"reminder_3d"}
    # Balance $35 < $65 renewal: the invoice stays open.
    run_lifecycle(t0 + timedelta(days=6, hours=1))
    renewal = Invoice.objects.get(lease=lease, kind="renewal")
    assert renewal.state == Invoice.State.OPEN and renewal.term_start == lease.ends_at
    assert renewal.amount_cents == 6500
    assert {"reminder_3d", "reminder_1d", "renewal_invoice"} <= set(
        Notification.objects.filter(lease=lease).values_list("kind", flat=True))

    run_lifecycle(t0 + timedelta(days=7, minutes=1))
    assert state(lease) == S.SUSPENDED
    assert lease.suspended_at == t0 + timedelta(days=7, minutes=1)
    assert lease.hold_until == lease.suspended_at + timedelta(hours=72)  # from the stop, not the end
    assert live_slots(lease) == 1  # slot held
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.ACTIVE  # disk untouched

    assert invoice_mark_paid(invoice=renewal, via="manual", now=t0 + timedelta(days=8))
    assert state(lease) == S.ACTIVE
    assert lease.ends_at == t0 + timedelta(days=14) and lease.hold_until is None
    # Paying the same invoice again does nothing.
    assert not invoice_mark_paid(invoice=renewal, via="manual", now=t0 + timedelta(days=8))
    lease.refresh_from_db()
    assert lease.ends_at == t0 + timedelta(days=14)


def test_unpaid_lease_is_released_key_destroyed_then_wiped(catalog, customer, t0, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    lease, _ = order(customer, t0)
    run_lifecycle(t0)
    end = t0 + timedelta(days=7)
    run_lifecycle(end + timedelta(minutes=1))
    assert state(lease) == S.SUSPENDED
    run_lifecycle(end + timedelta(hours=72))
    assert state(lease) == S.SUSPENDED  # suspended at end + 1 min: held until end + 72 h 1 min
    released_at = end + timedelta(hours=72, minutes=1)
    run_lifecycle(released_at)
    # Released, key destroyed and wiped in the same pass: the wipe follows the key's
    # destruction at once; wipe_by (7 days after the stop) is only the deadline.
    assert state(lease) == S.WIPED and live_slots(lease) == 0
    assert lease.ended_at == released_at and lease.wipe_by == end + timedelta(days=7, minutes=1)
    key = DiskKey.objects.get(lease=lease)
    assert key.state == DiskKey.State.DESTROYED and "luks-key-destroyed" in key.destruction_proof
    assert key.destroyed_at == released_at
    assert Invoice.objects.get(lease=lease, kind="renewal").state == Invoice.State.VOID
    assert Notification.objects.filter(lease=lease, kind="released").exists()
    kinds = list(LeaseEvent.objects.filter(lease=lease).values_list("kind", flat=True))
    assert kinds == ["created", "paid", "provisioned", "suspended", "released", "key_destroy_requested",
                     "key_destroyed", "wiped"]


def test_payment_after_release_goes_to_balance_and_never_revives(catalog, customer, t0, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    lease, _ = order(customer, t0)
    run_lifecycle(t0)
    renewal_time = t0 + timedelta(days=6, hours=1)
    run_lifecycle(renewal_time)
    renewal = Invoice.objects.get(lease=lease, kind="renewal")
    run_lifecycle(t0 + timedelta(days=7, minutes=1))
    run_lifecycle(t0 + timedelta(days=10, minutes=2))
    assert state(lease) == S.WIPED
    # The renewal was voided at release; a late coin payment for it is credited (the coin layer
    # reopens nothing). Simulate the case where the invoice was still open: mark paid directly.
    Invoice.objects.filter(pk=renewal.pk).update(state=Invoice.State.OPEN)
    assert invoice_mark_paid(invoice=renewal, via="LTC", now=t0 + timedelta(days=11))
    assert state(lease) == S.WIPED
    late = LedgerEntry.objects.get(kind=LedgerEntry.Kind.LATE_PAYMENT)
    assert late.amount_cents == 6500 and Account.objects.get(customer=customer).balance_cents == 6500


def test_unpaid_order_expires_and_frees_slots(catalog, customer, t0, settings):
    window = settings.PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES  # an account that never paid
    lease, invoice = order(customer, t0, pay=False)
    assert state(lease) == S.PENDING and live_slots(lease) == 1
    run_lifecycle(t0 + timedelta(minutes=window - 1))
    assert state(lease) == S.PENDING
    run_lifecycle(t0 + timedelta(minutes=window))
    assert state(lease) == S.CANCELLED and live_slots(lease) == 0
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.EXPIRED


def test_refund_within_the_hour_and_refused_after(catalog, customer, t0, settings,
                                                  django_capture_on_commit_callbacks):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=20_000, now=t0)
    lease, _ = order(customer, t0)
    run_lifecycle(t0)
    with django_capture_on_commit_callbacks(execute=True):
        refunded = lease_refund(lease=lease, actor=customer, now=t0 + timedelta(minutes=59))
    assert refunded == 6500
    assert state(lease) == S.CANCELLED and live_slots(lease) == 0
    assert Account.objects.get(customer=customer).balance_cents == 20_000
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED
    late_lease, _ = order(customer, t0)
    with pytest.raises(BillingError, match="within 60 minutes"):
        lease_refund(lease=late_lease, actor=customer, now=t0 + timedelta(minutes=61))
    assert state(late_lease) == S.PROVISIONING


def test_sweeps_run_twice_give_the_same_result_as_once(catalog, customer, t0, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    lease, _ = order(customer, t0)
    for at in [t0, t0 + timedelta(days=6, hours=1), t0 + timedelta(days=7, minutes=1),
               t0 + timedelta(days=10, minutes=1)]:
        first = run_lifecycle(at)
        assert run_lifecycle(at) == [] or all(name == "key_destruction" for name, _ in run_lifecycle(at))
        assert first
    assert Invoice.objects.filter(lease=lease, kind="renewal").count() == 1
    assert LeaseEvent.objects.filter(lease=lease, kind="suspended").count() == 1
    assert Notification.objects.filter(lease=lease, kind="reminder_1d").count() == 1


def test_auto_renew_from_balance(catalog, customer, t0, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=13_000, now=t0)
    lease, _ = order(customer, t0)
    run_lifecycle(t0)
    run_lifecycle(t0 + timedelta(days=6, hours=1))
    assert Invoice.objects.get(lease=lease, kind="renewal").state == Invoice.State.PAID
    lease.refresh_from_db()
    assert lease.ends_at == t0 + timedelta(days=14)
    run_lifecycle(t0 + timedelta(days=7, minutes=1))
    assert state(lease) == S.ACTIVE


def test_addons_priced_pro_rata_and_price_locked(catalog, customer, t0):
    lease, invoice = order(customer, t0, offer="h100-sxm", term="week", pay=False,
                           addons={"extra_nvme_tb": 2, "network_volume_tb": 1})
    # $475 + 2 TB × ceil(900 × 7/30) + 1 TB × ceil(1400 × 7/30)
    assert invoice.amount_cents == 47500 + 2 * 210 + 327 == lease.price_cents
    assert invoice.lines.count() == 3


def test_checkout_refuses_unknown_or_out_of_range_addons(catalog, customer, t0):
    for addons in ({"gold_plating_tb": 1}, {"extra_nvme_tb": 31}, {"snapshot_tb": -1}, {"snapshot_tb": 1},
                   {"network_volume_tb": "2"}):
        with pytest.raises(BillingError):
            order(customer, t0, pay=False, addons=addons)
    assert not Lease.objects.exists()


def test_refund_by_another_customer_is_refused(catalog, customer, other_customer, t0):
    lease, _ = order(customer, t0, pay=False)
    with pytest.raises(BillingError, match="Only the lease's customer"):
        lease_refund(lease=lease, actor=other_customer, now=t0)
    assert state(lease) == S.PENDING


def test_refund_window_counts_from_the_order_time(catalog, customer, t0):
    lease, _ = order(customer, t0 - timedelta(hours=2), pay=False)
    assert lease.created_at == t0 - timedelta(hours=2)
    with translation.override("en"), pytest.raises(BillingError, match="within 60 minutes"):
        lease_refund(lease=lease, actor=customer, now=t0)


def test_refund_window_ends_exactly_when_the_setting_says(catalog, customer, t0, settings):
    settings.LEASE_REFUND_WINDOW_MINUTES = 25  # not the default: a retyped 60 shows
    balance_top_up(customer=customer, amount_cents=2 * 6500, now=t0)
    late, _ = order(customer, t0)
    with pytest.raises(BillingError, match="within 25 minutes"):
        lease_refund(lease=late, actor=customer, now=t0 + timedelta(minutes=25))
    on_time, _ = order(customer, t0)
    assert lease_refund(lease=on_time, actor=customer, now=t0 + timedelta(minutes=25) - timedelta(seconds=1)) == 6500


def test_key_destruction_is_refused_while_a_term_is_paid(catalog, customer, operator, t0, settings):
    from rental.services import lease_release, lease_suspend
    from rental.transitions import TransitionRefused

    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    lease, _ = order(customer, t0)
    run_lifecycle(t0)
    mid_term = t0 + timedelta(days=2)
    assert lease_suspend(lease_id=lease.pk, now=mid_term, actor=operator, reason="abuse report", force=True)
    lease.refresh_from_db()
    assert lease.suspended_at == mid_term
    assert lease.hold_until == t0 + timedelta(days=7, hours=72)  # counted from the paid term's end
    with pytest.raises(TransitionRefused, match="paid term"):
        lease_release(lease_id=lease.pk, now=mid_term, actor=operator, reason="try", force=True)
    assert state(lease) == S.SUSPENDED and DiskKey.objects.get(lease=lease).state == DiskKey.State.ACTIVE
    run_lifecycle(t0 + timedelta(days=5))
    assert state(lease) == S.SUSPENDED  # the sweep does not release it mid-term either
