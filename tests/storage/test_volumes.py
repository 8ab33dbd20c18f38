"""Network volumes on the real test cluster, through the storefront's services: what is
charged exists (a CephFS subvolume with the volume's quota), a short balance or a cluster
that is down, full or below three replicas creates and charges nothing, growing raises the
quota, deleting purges the subvolume (retried by the sweep), node keys follow attachments."""
import pytest
from django.utils import timezone

from billing.models import LedgerEntry
from billing.services import InsufficientBalance, balance_top_up
from inventory.models import AuditEntry, Site
from rental.models import NetworkVolume
from rental.storage import storage_delete
from storage.charges import volume_grow_order, volume_order
from storage.models import StorageCharge, StorageCluster, VolumeStore
from storage.sweeps import sweep_ceph
from storage.volumes import StorageUnavailable, ceph_for, cluster_check

pytestmark = pytest.mark.django_db(transaction=True)


def _dfw():
    return Site.objects.get(code="DFW-1")


def test_order_creates_the_subvolume_then_charges(site_cluster, customer):
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    volume = volume_order(customer=customer, site=_dfw(), name="data", size_tb=2, now=timezone.now())
    store = VolumeStore.objects.get(volume=volume)
    info = ceph_for(site_cluster).subvolume_info(store.subvolume)
    assert int(info["bytes_quota"]) == 2 * 8 * 2**20 and store.path.startswith("/volumes/storefront/")
    charge = StorageCharge.objects.get(kind="volume", object_id=volume.pk)
    assert charge.site.code == "DFW-1" and charge.entry.amount_cents == -2 * 1400
    assert AuditEntry.objects.filter(action="volume_store_create", object_id=str(store.pk)).exists()

    # More TB: the quota is raised and the rest of the term is charged pro rata.
    volume_grow_order(volume=volume, size_tb=3, now=timezone.now(), actor=customer)
    assert int(ceph_for(site_cluster).subvolume_info(store.subvolume)["bytes_quota"]) == 3 * 8 * 2**20
    assert NetworkVolume.objects.get(pk=volume.pk).size_tb == 3
    assert StorageCharge.objects.filter(object_id=volume.pk).count() == 2

    # Deleted by the customer: the sweep purges the subvolume, once.
    storage_delete(obj=volume, now=timezone.now(), actor=customer, reason="test")
    sweep_ceph(timezone.now())
    store.refresh_from_db()
    assert store.state == VolumeStore.State.PURGED
    assert ceph_for(site_cluster).subvolume_info(store.subvolume) is None
    sweep_ceph(timezone.now())
    assert AuditEntry.objects.filter(action="volume_store_purged", object_id=str(store.pk)).count() == 1


def test_short_balance_creates_nothing(site_cluster, customer):
    before = set(ceph_for(site_cluster).subvolume_names())
    with pytest.raises(InsufficientBalance):
        volume_order(customer=customer, site=_dfw(), name="data", size_tb=1, now=timezone.now())
    assert set(ceph_for(site_cluster).subvolume_names()) == before
    assert not NetworkVolume.objects.exists() and not LedgerEntry.objects.filter(amount_cents__lt=0).exists()


def test_cluster_down_is_a_clear_refusal_and_an_alert(site_cluster, customer):
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    StorageCluster.objects.filter(pk=site_cluster.pk).update(mon_host="127.0.0.1:9", checked_at=None)
    with pytest.raises(StorageUnavailable, match="not answering"):
        volume_order(customer=customer, site=_dfw(), name="data", size_tb=1, now=timezone.now())
    assert not NetworkVolume.objects.exists()
    assert not LedgerEntry.objects.filter(amount_cents__lt=0).exists()
    assert "unreachable" in StorageCluster.objects.get(pk=site_cluster.pk).alert


def test_pool_below_three_replicas_is_an_alert_and_not_sold(site_cluster, customer, ceph_cluster):
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    ceph_cluster.ceph("osd", "pool", "set", "cephfs_data", "size", "2")
    try:
        checked = cluster_check(cluster=site_cluster, now=timezone.now())
        assert checked.min_pool_size == 2 and not checked.three_replicas and "below 3" in checked.alert
        with pytest.raises(StorageUnavailable, match="three replicas"):
            volume_order(customer=customer, site=_dfw(), name="data", size_tb=1, now=timezone.now())
        assert not NetworkVolume.objects.exists()
    finally:
        ceph_cluster.ceph("osd", "pool", "set", "cephfs_data", "size", "3")
    assert cluster_check(cluster=site_cluster, now=timezone.now()).three_replicas


