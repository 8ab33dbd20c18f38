"""The order page's volume add-on around its edges, on the demo's simulated storage (the
real cluster's paths are tests/storage/test_ordered_volumes.py): an add-on left pending
(no commit hook ran: a crash) is created by the storage sweep; a lease refunded before
its volume exists refunds everything and the volume is never created; once created, the
lease's renewals no longer include it. And a lease that ends lets go of its volumes at
once, whichever way it ends."""
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Account, Invoice, LedgerEntry
from billing.refunds import lease_refund
from billing.renewals import renewal_invoice_create
from billing.services import balance_top_up
from inventory.models import AuditEntry, Site
from rental.models import Lease, LeaseEvent, NetworkVolume, Notification, VolumeAttachment
from rental.services import lease_release, lease_suspend
from rental.storage import volume_attach
from storage.charges import volume_order
from storage.models import OrderedVolume
from storage.sweeps import sweep_ceph

ADDON = {"network_volume_tb": 1}


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


def _balance(customer) -> int:
    return Account.objects.get(customer=customer).balance_cents


def test_a_pending_addon_is_created_by_the_sweep_and_renewals_leave_it_out(catalog, customer, place, now, settings):
    lease = place(customer, now, term="month", addons=ADDON)            # $230 + $14, no commit hook ran
    row = OrderedVolume.objects.get(lease=lease)
    assert row.state == "pending" and row.cents == 1400 and not NetworkVolume.objects.exists()
    retry = timedelta(seconds=settings.STORAGE_ORDERED_VOLUME_RETRY_SECONDS)
    sweep_ceph(now + retry - timedelta(seconds=1))                       # too soon: the hook may still run
    assert OrderedVolume.objects.get(pk=row.pk).state == "pending"
    sweep_ceph(now + retry)
    row.refresh_from_db()
    assert row.state == "created" and row.volume.size_tb == 1 and row.volume.store.simulated
    assert VolumeAttachment.objects.filter(volume=row.volume, lease=lease, detached_at__isnull=True).exists()
    assert row.volume.paid_until == now + retry + timedelta(days=30)
    sweep_ceph(now + retry * 2)                                           # once
    assert NetworkVolume.objects.count() == 1
    assert AuditEntry.objects.filter(action="lease_volume_addon_settled", object_id=str(lease.pk)).exists()

    lease.refresh_from_db()
    assert lease.price_cents == 23000
    balance_top_up(customer=customer, amount_cents=23000, now=now)
    renewal = renewal_invoice_create(lease=lease, now=lease.ends_at - timedelta(hours=23))
    assert renewal.amount_cents == 23000                                 # the volume renews on its own term


def test_a_lease_refunded_before_its_volume_exists_refunds_all_of_it(catalog, customer, place, now, settings):
    lease = place(customer, now, term="week", addons=ADDON)             # $65 + $3.27, pending
    assert _balance(customer) == 0
    assert lease_refund(lease=lease, actor=customer, now=now + timedelta(minutes=5)) == 6500 + 327
    assert _balance(customer) == 6500 + 327
    [refund] = LedgerEntry.objects.filter(kind="refund")                # one refund, the customer's
    assert refund.amount_cents == 6500 + 327 and refund.actor == customer
    assert Invoice.objects.get(lease=lease).refunded_cents == 6500 + 327
    assert OrderedVolume.objects.get(lease=lease).state == "refunded"
    sweep_ceph(now + timedelta(hours=1))
    assert not NetworkVolume.objects.exists()                            # never created afterwards
    assert not Notification.objects.filter(kind="volume_not_created").exists()  # the customer asked for it


def test_a_volume_created_with_the_order_is_kept_and_not_refunded(catalog, customer, place, now, settings):
    lease = place(customer, now, term="week", addons=ADDON)
    sweep_ceph(now + timedelta(seconds=settings.STORAGE_ORDERED_VOLUME_RETRY_SECONDS))
    volume = OrderedVolume.objects.get(lease=lease).volume
    assert lease_refund(lease=Lease.objects.get(pk=lease.pk), actor=customer, now=now + timedelta(minutes=5)) == 6500
    assert _balance(customer) == 6500
    assert NetworkVolume.objects.get(pk=volume.pk).state == "active"
    assert not VolumeAttachment.objects.filter(volume=volume, detached_at__isnull=True).exists()


@pytest.mark.parametrize("how", ["refund", "release"])
def test_a_lease_that_ends_lets_go_of_its_volumes_at_once(catalog, customer, place, now, how):
    lease = place(customer, now, term="week")
    balance_top_up(customer=customer, amount_cents=1400, now=now)
    volume = volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="data", size_tb=1, now=now)
    volume_attach(volume=volume, lease=lease, now=now)
    if how == "refund":
        lease_refund(lease=lease, actor=customer, now=now + timedelta(minutes=5))
    else:
        lease = Lease.objects.get(pk=lease.pk)
        assert lease_suspend(lease_id=lease.pk, now=lease.ends_at + timedelta(minutes=1))
        assert lease_release(lease_id=lease.pk, now=lease.ends_at + timedelta(hours=73))
    # no sweep ran: detached by the lease's end itself
    assert not VolumeAttachment.objects.filter(volume=volume, detached_at__isnull=True).exists()
    event = LeaseEvent.objects.get(lease=lease, kind="volume_detached")
    assert event.reason == "lease ended" and event.data == {"volume": volume.pk}
    assert NetworkVolume.objects.get(pk=volume.pk).state == "active"    # the volume survives the lease
