"""`leases_release`, the release sweep's batch (`lease_release` is a batch of one): only
suspended leases whose hold has expired are released, unless forced; each released lease's
slots go back to stock, its disk key is asked to be destroyed and its timeline says why; other
leases, and a second call, change nothing."""
from datetime import timedelta

import pytest

from inventory.models import SlotAllocation
from rental.models import DiskKey, Lease, LeaseEvent, LeaseState
from rental.services import lease_suspend, leases_release
from tests.automation.helpers import active_lease
from tests.factories import new_customer

pytestmark = pytest.mark.django_db


def suspended(customer, t0, hold_until):
    lease = active_lease(customer, t0)
    assert lease_suspend(lease_id=lease.pk, now=lease.ends_at, force=True)
    Lease.objects.filter(pk=lease.pk).update(hold_until=hold_until)
    return lease


def test_a_batch_releases_only_the_suspended_leases_whose_hold_expired(catalog, t0):
    now = t0 + timedelta(days=30)
    due = suspended(new_customer("due"), t0, hold_until=now - timedelta(minutes=1))
    held = suspended(new_customer("held"), t0, hold_until=now + timedelta(days=1))
    running = active_lease(new_customer("running"), t0)
    slots = {lease.pk: SlotAllocation.objects.filter(lease_id=lease.pk, released_at=None).count()
             for lease in (due, held, running)}
    assert all(slots.values())

    assert leases_release([due.pk, held.pk, running.pk], now=now, reason="hold expired unpaid") == [due.pk]

    states = dict(Lease.objects.filter(pk__in=slots).values_list("pk", "state"))
    assert states == {due.pk: LeaseState.RELEASED, held.pk: LeaseState.SUSPENDED, running.pk: LeaseState.ACTIVE}
    assert Lease.objects.get(pk=due.pk).ended_at == now
    assert not SlotAllocation.objects.filter(lease_id=due.pk, released_at=None).exists()
    assert SlotAllocation.objects.filter(lease_id=held.pk, released_at=None).count() == slots[held.pk]
    assert DiskKey.objects.get(lease=due).destroy_requested_at == now
    assert DiskKey.objects.get(lease=held).destroy_requested_at is None
    event = LeaseEvent.objects.get(lease=due, kind="released")
    assert (event.at, event.reason) == (now, "hold expired unpaid")
    assert not LeaseEvent.objects.filter(lease__in=[held, running], kind="released").exists()

    assert leases_release([due.pk, held.pk, running.pk], now=now + timedelta(minutes=1)) == []
    assert LeaseEvent.objects.filter(lease=due, kind="released").count() == 1


def test_forced_a_held_lease_is_released_before_its_hold_ends(catalog, t0):
    now = t0 + timedelta(days=30)
    held = suspended(new_customer("held"), t0, hold_until=now + timedelta(days=1))
    assert leases_release([held.pk], now=now, reason="operator", force=True) == [held.pk]
    assert Lease.objects.get(pk=held.pk).state == LeaseState.RELEASED
