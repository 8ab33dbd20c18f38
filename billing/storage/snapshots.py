"""Where a snapshot lives (issue 26): an RGW user and bucket of its own at the lease's
site, with a quota of the snapshot's size, and a restic password generated here. The
node gets the S3 key and the password in its desired state, only for the snapshot's op;
the storefront keeps both sealed (rental.sealing) to restore later. Destroying the key
purges the RGW user with its objects, then forgets the password (rental.storage)."""
import secrets
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext as _

from inventory.audit import audit_record
from inventory.models import Site
from rental.events import event_record as _event
from rental.models import Lease, LeaseState, Snapshot
from rental.sealing import seal
from rental.storage import StorageRefused

from .ceph import CephError, CephUnavailable
from .volumes import StorageUnavailable, bytes_per_tb, ceph_for, cluster_of

S = LeaseState


def _ceph(site: Site):
    """The site's cluster with an RGW; None: storage is simulated here (demo, tests)."""
    cluster = cluster_of(site)
    if cluster is None and settings.STORAGE_SIMULATED:
        return None, ""
    if cluster is None or not cluster.rgw_endpoint:
        raise StorageUnavailable(_("Snapshots are not available at %(site)s.") % {"site": site.code})
    return ceph_for(cluster), cluster.rgw_endpoint


def snapshot_repository_open(*, site: Site, snapshot_id: int, size_tb: int) -> dict | None:
    """An RGW user, key and bucket name for the snapshot, and its restic password. None
    when the site's storage is simulated."""
    ceph, endpoint = _ceph(site)
    if ceph is None:
        return None
    uid = f"snap-{snapshot_id}-{secrets.token_hex(4)}"
    try:
        ceph.s3_user_ensure(uid, display_name=f"snapshot {snapshot_id}", max_bytes=size_tb * bytes_per_tb())
        access, secret = ceph.s3_key_create(uid)
    except (CephError, CephUnavailable) as exc:
        raise StorageUnavailable(_("The storage at %(site)s is not answering right now; nothing was taken or "
                                   "charged. Please try again later.") % {"site": site.code}) from exc
    return {"rgw_uid": uid, "repository": f"s3:{endpoint.rstrip('/')}/{uid}", "access_key": access,
            "secret_key": secret, "password": secrets.token_urlsafe(32)}


def snapshot_objects_purge(*, site: Site, rgw_uid: str) -> bool:
    """Remove the snapshot's RGW user with every object it stored; False: simulated."""
    ceph, _endpoint = _ceph(site)
    if ceph is None or not rgw_uid:
        return False
    try:
        ceph.s3_user_remove(rgw_uid)
    except (CephError, CephUnavailable) as exc:
        raise StorageUnavailable(_("The storage at %(site)s is not answering right now; the snapshot was not "
                                   "deleted. Please try again later.") % {"site": site.code}) from exc
    return True


@transaction.atomic
def snapshot_take(*, lease: Lease, size_tb: int, paid_until: datetime, now: datetime, actor=None) -> Snapshot:
    """The row, then its repository at the lease's site (issue 26): `creating` until the
    node proves the copy (snapshot_ready); on a site whose storage is simulated (demo,
    tests without Ceph) nothing is copied and the row is ready at once, as simulated
    volumes are."""
    if lease.state not in (S.ACTIVE, S.SUSPENDED):
        raise StorageRefused(f"Lease #{lease.pk} is {lease.get_state_display()}: its disk cannot be snapshotted.")
    if size_tb < 1:
        raise StorageRefused("A snapshot is at least 1 TB.")
    snap = Snapshot.objects.create(customer_id=lease.customer_id, source_lease=lease, region=lease.site.region,
                                   site=lease.site, size_tb=size_tb, created_at=now, paid_until=paid_until,
                                   state=Snapshot.State.CREATING)
    repo = snapshot_repository_open(site=lease.site, snapshot_id=snap.pk, size_tb=size_tb)
    if repo is None:
        Snapshot.objects.filter(pk=snap.pk).update(state=Snapshot.State.AVAILABLE, ready_at=now)
    else:
        Snapshot.objects.filter(pk=snap.pk).update(
            rgw_uid=repo["rgw_uid"], repository=repo["repository"], access_key=repo["access_key"],
            sealed_secrets=seal({"secret_key": repo["secret_key"], "password": repo["password"]}))
    snap.refresh_from_db()
    _event(lease.pk, kind="snapshot_taken", now=now, actor=actor, from_state=lease.state, to_state=lease.state,
           data={"snapshot": snap.pk, "size_tb": size_tb, "simulated": repo is None})
    audit_record(actor=actor, action="snapshot_create", obj=snap,
                 detail={"lease": lease.pk, "state": snap.state, "rgw_uid": snap.rgw_uid}, at=now)
    return snap


@transaction.atomic
def snapshot_key_destroy(*, snapshot_id: int, now: datetime, actor=None) -> bool:
    """Purge the snapshot's objects (its RGW user) and forget its password and key: nothing
    can read it any more. Recorded like a lease's key destruction."""
    snap = Snapshot.objects.select_for_update().get(pk=snapshot_id)
    if snap.key_destroyed_at is not None:
        return False
    purged = snapshot_objects_purge(site=snap.site, rgw_uid=snap.rgw_uid) if snap.site_id else False
    Snapshot.objects.filter(pk=snap.pk).update(key_destroyed_at=now, sealed_secrets="", access_key="",
                                               progress=None)
    audit_record(actor=actor, action="snapshot_key_destroyed", obj=snap,
                 detail={"rgw_uid": snap.rgw_uid, "repository": snap.repository, "objects_purged": purged,
                         "password_forgotten": bool(snap.sealed_secrets)}, at=now)
    _event(snap.source_lease_id, kind="snapshot_key_destroyed", now=now, actor=actor,
           data={"snapshot": snap.pk, "objects_purged": purged})
    return True


def snapshot_deleted(sender, *, snapshot_id: int, now, actor=None, **kwargs) -> None:
    """rental.storage.snapshot_deleted's receiver (billing.apps)."""
    snapshot_key_destroy(snapshot_id=snapshot_id, now=now, actor=actor)
