"""The storage sweep's orphan pass on the real test cluster: a subvolume no live volume owns
(its volume row gone, or a delete that failed half way) is purged once older than
STORAGE_ORPHAN_GRACE_SECONDS, with an audit row; a paid volume's subvolume, a lapsed one's,
one still being ordered (younger than the grace) and anything outside the storefront's
naming are never touched."""
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.services import balance_top_up
from inventory.models import AuditEntry, Site
from rental.models import NetworkVolume
from rental.storage import storage_delete, storage_lapse
from storage.charges import volume_order
from storage.models import StorageCluster, VolumeStore
from storage.sweeps import sweep_ceph
from storage.volumes import ceph_for

pytestmark = pytest.mark.django_db(transaction=True)
MIB = 2**20


def _purged_audits(cluster) -> set[str]:
    return {a.detail["subvolume"] for a in AuditEntry.objects.filter(action="volume_orphan_purged",
                                                                     object_id=str(cluster.pk))}


def test_orphans_are_purged_and_paid_volumes_never(site_cluster, customer, settings):
    ceph = ceph_for(site_cluster)
    dfw = Site.objects.get(code="DFW-1")
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    paid = volume_order(customer=customer, site=dfw, name="paid", size_tb=1, now=timezone.now())
    lapsed = volume_order(customer=customer, site=dfw, name="lapsed", size_tb=1, now=timezone.now())
    storage_lapse(obj=lapsed, now=timezone.now())
    # A delete that failed half way: the row says purged, the subvolume is still there.
    half = volume_order(customer=customer, site=dfw, name="half", size_tb=1, now=timezone.now())
    storage_delete(obj=half, now=timezone.now(), actor=customer, reason="test")
    VolumeStore.objects.filter(volume=half).update(state=VolumeStore.State.PURGED, purged_at=timezone.now())
    # A subvolume whose volume row was removed (no row at all), and one not the storefront's.
    ceph.subvolume_create("nv-0rphan0rphan", size_bytes=MIB)
    ceph.subvolume_create("operator-scratch", size_bytes=MIB)
    stores = {v.name: VolumeStore.objects.get(volume=v).subvolume for v in (paid, lapsed, half)}

    # Within the grace (a volume being ordered has its subvolume before its row): nothing.
    sweep_ceph(timezone.now())
    names = set(ceph.subvolume_names())
    assert {"nv-0rphan0rphan", stores["half"]} <= names and not _purged_audits(site_cluster)

    later = timezone.now() + timedelta(seconds=settings.STORAGE_ORPHAN_GRACE_SECONDS + 60)
    sweep_ceph(later)
    names = set(ceph.subvolume_names())
    assert "nv-0rphan0rphan" not in names and stores["half"] not in names
    assert {stores["paid"], stores["lapsed"], "operator-scratch"} <= names
    # (earlier tests' volumes, whose rows the test database dropped, are orphans too)
    assert {"nv-0rphan0rphan", stores["half"]} <= _purged_audits(site_cluster)
    assert not {stores["paid"], stores["lapsed"]} & _purged_audits(site_cluster)
    assert NetworkVolume.objects.get(pk=paid.pk).state == "active"
    audits = AuditEntry.objects.filter(action="volume_orphan_purged").count()
    sweep_ceph(later)  # once: nothing left to purge, no second audit row
    assert AuditEntry.objects.filter(action="volume_orphan_purged").count() == audits
    ceph.subvolume_remove("operator-scratch")


def test_orphan_pass_does_nothing_when_ceph_does_not_answer(site_cluster):
    ceph_for(site_cluster).subvolume_create("nv-0rphan0down", size_bytes=MIB)
    real = site_cluster.mon_host
    StorageCluster.objects.filter(pk=site_cluster.pk).update(mon_host="127.0.0.1:9")
    sweep_ceph(timezone.now() + timedelta(days=1))
    assert not AuditEntry.objects.filter(action="volume_orphan_purged").exists()
    StorageCluster.objects.filter(pk=site_cluster.pk).update(mon_host=real)
    assert "nv-0rphan0down" in ceph_for(StorageCluster.objects.get(pk=site_cluster.pk)).subvolume_names()
    sweep_ceph(timezone.now() + timedelta(days=1))
    assert "nv-0rphan0down" not in ceph_for(site_cluster).subvolume_names()


def test_a_dry_run_previews_no_cluster_work(site_cluster):
    """`manage.py lifecycle --dry-run` rolls its transaction back; a purged subvolume could
    not come back, so the dry run leaves the storage sweep out and says so."""
    from io import StringIO

    from django.core.management import call_command

    ceph_for(site_cluster).subvolume_create("nv-0rphandry0", size_bytes=MIB)
    out = StringIO()
    call_command("lifecycle", "--dry-run", "--at", (timezone.now() + timedelta(days=1)).isoformat(), stdout=out)
    assert "not previewed (they act on the storage cluster): ceph" in out.getvalue()
    assert "nv-0rphandry0" in ceph_for(site_cluster).subvolume_names()
    assert not AuditEntry.objects.filter(action="volume_orphan_purged").exists()
    sweep_ceph(timezone.now() + timedelta(days=1))  # the real pass does purge it
    assert "nv-0rphandry0" not in ceph_for(site_cluster).subvolume_names()
