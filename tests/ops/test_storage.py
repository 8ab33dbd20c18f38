"""Storage products: network volumes (several leases at a site, survive release, billed
per TB-month on their own term), snapshots (restored at their site), and egress
metering billed on the renewal invoice beyond the included 20 TB per instance-month."""
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.egress import egress_record
from billing.models import Account, EgressUsage, Invoice, LedgerEntry
from billing.services import InsufficientBalance, balance_top_up
from inventory.models import AuditEntry, Site
from ops.lifecycle import run_lifecycle
from rental.agent import agent_override
from rental.models import LeaseEvent, NetworkVolume, Snapshot, VolumeAttachment
from rental.storage import (
    RESTORE_INTO,
    StorageRefused,
    lease_restore_into,
    restore_into_pending,
    volume_attach,
)
from storage.charges import snapshot_order, sweep_storage, volume_order


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0) - timedelta(days=20)


def balance(c):
    return Account.objects.get(customer=c).balance_cents


def test_network_volume_lifecycle(catalog, customer, other_customer, place, now):
    a = place(customer, now, term="week")
    b = place(customer, now, term="week", offer="a100-sxm")
    with pytest.raises(InsufficientBalance):
        volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="data", size_tb=2, now=now)
    assert not NetworkVolume.objects.exists()  # nothing created without the money
    balance_top_up(customer=customer, amount_cents=2 * 1400 + 1000, now=now)
    vol = volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="data", size_tb=2, now=now)
    assert balance(customer) == 1000 and vol.paid_until == now + timedelta(days=30)
    assert AuditEntry.objects.filter(action="volume_create", object_id=str(vol.pk)).exists()
    volume_attach(volume=vol, lease=a, now=now)
    volume_attach(volume=vol, lease=b, now=now)  # several leases at the same site
    assert VolumeAttachment.objects.filter(volume=vol, detached_at__isnull=True).count() == 2
    other = place(other_customer, now, term="week")
    with pytest.raises(StorageRefused, match="different customers"):
        volume_attach(volume=vol, lease=other, now=now)
    elsewhere = place(customer, now, term="week", site="IAD-1")
    with pytest.raises(StorageRefused, match="another site"):
        volume_attach(volume=vol, lease=elsewhere, now=now)

    # Lease a is released (unpaid week + 72 h hold): the volume survives, detached from it.
    run_lifecycle(now + timedelta(days=7, hours=1))  # suspended
    run_lifecycle(now + timedelta(days=10, hours=1))  # released
    vol.refresh_from_db()
    assert vol.state == "active"
    assert not VolumeAttachment.objects.filter(volume=vol, detached_at__isnull=True).exists()
    assert LeaseEvent.objects.filter(lease=a, kind="volume_detached").exists()

    # Its own term: renewed from the balance at day 30 when it covers it, else lapsed, then deleted.
    balance_top_up(customer=customer, amount_cents=1800, now=now)
    sweep_storage(now + timedelta(days=30))
    vol.refresh_from_db()
    assert vol.paid_until == now + timedelta(days=60) and balance(customer) == 0
    sweep_storage(now + timedelta(days=30))  # once per term
    assert LedgerEntry.objects.filter(memo__startswith=f"network volume #{vol.pk}").count() == 2
    sweep_storage(now + timedelta(days=60))
    vol.refresh_from_db()
    assert vol.state == "lapsed"
    sweep_storage(now + timedelta(days=67, minutes=1))
    vol.refresh_from_db()
    assert vol.state == "deleted"


def test_a_simulated_snapshot_restores_at_its_site_at_once(catalog, customer, place, now):
    """Where storage is simulated (the demo), the lease page's restore keeps the one rule (the
    snapshot's own site) and is done at once: no node will copy anything."""
    source = place(customer, now, term="week", offer="a100-sxm")
    target = place(customer, now, term="week", offer="a100-sxm")
    snap = snapshot_order(lease=source, size_tb=1, now=now)
    assert balance(customer) == 0 and snap.repository == "" and snap.site_id == source.site_id
    lease_restore_into(lease=target, snapshot=snap, now=now)
    target.refresh_from_db()
    assert target.restore_from_id == snap.pk and target.restored_at == now
    assert restore_into_pending(target) is None
    assert [e.kind for e in target.events.filter(kind__startswith="snapshot_restore").order_by("pk")] == [
        RESTORE_INTO, "snapshot_restored"]
    # Behind real nodes a simulated snapshot is no copy of anything: refused, nothing recorded.
    again = place(customer, now, term="week", offer="a100-sxm")
    with agent_override(object()), pytest.raises(StorageRefused, match="holds no copy"):
        lease_restore_into(lease=again, snapshot=snap, now=now)
    assert not again.events.filter(kind__startswith="snapshot_restore").exists()
    elsewhere = place(customer, now, term="week", offer="h100-sxm", site="PDX-1")
    with pytest.raises(StorageRefused, match="stored at DFW-1"):
        lease_restore_into(lease=elsewhere, snapshot=snap, now=now)
    assert not elsewhere.events.filter(kind__startswith="snapshot_restore").exists()
    assert Snapshot.objects.get().state == "available"


def test_egress_overage_billed_on_the_renewal_once(catalog, customer, place, settings):
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=40)
    lease = place(customer, t0, term="month")  # RTX 3090, $230/month, 20 TB included
    egress_record(lease_id=lease.pk, tb_used=Decimal("12.5"), at=t0 + timedelta(days=10))
    egress_record(lease_id=lease.pk, tb_used=Decimal("23.456"), at=t0 + timedelta(days=28))
    egress_record(lease_id=lease.pk, tb_used=Decimal("20"), at=t0 + timedelta(days=28, hours=1))  # never shrinks
    row = EgressUsage.objects.get()
    assert row.term_start == t0 and row.tb_used == Decimal("23.456")
    run_lifecycle(t0 + timedelta(days=29, hours=1))  # renewal invoice 24 h before the end
    renewal = Invoice.objects.get(lease=lease, kind="renewal")
    egress = renewal.lines.get(description__startswith="Egress")
    # 3.456 TB over → 3.46 TB (per 0.01 TB) × 4 cents
    assert (egress.quantity, egress.unit_cents, egress.amount_cents) == (346, 4, 1384)
    assert renewal.amount_cents == 23000 + 1384
    # More traffic in the last day goes on the next renewal, not twice.
    egress_record(lease_id=lease.pk, tb_used=Decimal("24"), at=t0 + timedelta(days=29, hours=20))
    from billing.egress import egress_renewal_lines
    lines = egress_renewal_lines(lease=lease)
    assert [(x.quantity, x.unit_cents) for x in lines] == [(54, 4)]
    assert egress_renewal_lines(lease=lease) == []


def test_storage_admin_screens(catalog, customer, place, op_client, now):
    from django.urls import reverse
    lease = place(customer, now, term="week")
    balance_top_up(customer=customer, amount_cents=1400, now=now)
    vol = volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="ckpt", size_tb=1, now=now)
    volume_attach(volume=vol, lease=lease, now=now)
    egress_record(lease_id=lease.pk, tb_used=1, at=now + timedelta(hours=1))
    for name in ("rental_networkvolume", "rental_snapshot", "billing_egressusage"):
        assert op_client.get(reverse(f"admin:{name}_changelist")).status_code == 200
    assert op_client.get(reverse("admin:rental_networkvolume_change", args=[vol.pk])).status_code == 200
