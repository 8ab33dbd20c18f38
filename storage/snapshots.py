"""Where a snapshot lives: an RGW user and bucket of its own at the lease's
site, with a quota of the snapshot's size, and a restic password generated here. The
node gets the S3 key and the password in its desired state, only for the snapshot's op;
the storefront keeps both sealed (core.sealing) to restore later. Destroying the key
purges the RGW user with its objects, then forgets the password (rental.storage).

The key the storefront made with the repository is never handed out: each node gets a key of
its own for each op it is sent (SnapshotNodeKey), removed from RGW once the op is no longer
sent to it — done, failed, the lease ended or moved, the snapshot deleted (ADR 0010)."""
import logging
import secrets
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from core.sealing import seal, unseal
from inventory.audit import audit_record
from inventory.models import Node, Site, SlotAllocation
from rental.events import event_record as _event
from rental.models import Lease, LeaseState, Snapshot
from rental.storage import StorageRefused, snapshot_repository

from .ceph import CephError, CephUnavailable
from .models import SnapshotNodeKey
from .volumes import StorageUnavailable, bytes_per_tb, ceph_for, cluster_of

log = logging.getLogger(__name__)

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
    """The row, then its repository at the lease's site: `creating` until the
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
    # The nodes' keys went with the RGW user.
    SnapshotNodeKey.objects.filter(snapshot_id=snap.pk, revoked_at__isnull=True).update(
        revoked_at=now, sealed_secret="", last_error="")
    audit_record(actor=actor, action="snapshot_key_destroyed", obj=snap,
                 detail={"rgw_uid": snap.rgw_uid, "repository": snap.repository, "objects_purged": purged,
                         "password_forgotten": bool(snap.sealed_secrets)}, at=now)
    _event(snap.source_lease_id, kind="snapshot_key_destroyed", now=now, actor=actor,
           data={"snapshot": snap.pk, "objects_purged": purged})
    return True


def snapshot_deleted(sender, *, snapshot_id: int, now, actor=None, **kwargs) -> None:
    """rental.storage.snapshot_deleted's receiver (billing.apps)."""
    snapshot_key_destroy(snapshot_id=snapshot_id, now=now, actor=actor)


# --- the nodes' keys (fleet.desired asks; the storage sweep and the node's proof take back) -----

#: Lease states in which a node may still be sent a snapshot op for the lease.
_LIVE = (LeaseState.PENDING, LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED)


def snapshot_node_repository(*, snap: Snapshot, lease: Lease, node: Node, purpose: str,
                             now: datetime) -> dict | None:
    """The repository as `node` is told it for one op on `lease` (take or restore), with an
    S3 key made for that node and op alone (made on the first ask, the same one after). None
    when the cluster cannot make one now: the op is not sent this time. A site without a
    cluster (simulated storage, nothing to revoke) gets the snapshot's own entry."""
    cluster = cluster_of(snap.site) if snap.site_id else None
    if cluster is None or not snap.rgw_uid:
        return snapshot_repository(snap)
    live = dict(snapshot=snap, lease=lease, node=node, purpose=purpose, revoked_at__isnull=True)
    row = SnapshotNodeKey.objects.filter(**live).first()
    if row is None:
        try:
            access, secret = ceph_for(cluster).s3_key_create(snap.rgw_uid)
        except (CephError, CephUnavailable) as exc:
            log.warning("snapshot #%s: no key for node %s: %s", snap.pk, node.name, exc)
            return None
        try:
            with transaction.atomic():
                row = SnapshotNodeKey.objects.create(
                    snapshot=snap, lease=lease, node=node, purpose=purpose, access_key=access,
                    sealed_secret=seal({"secret_key": secret}), created_at=now)
                audit_record(actor=None, action="snapshot_node_key_create", obj=snap,
                             detail={"node": node.name, "lease": lease.pk, "purpose": purpose, "access_key": access},
                             at=now)
        except IntegrityError:      # a poll beside this one made the key first: ours goes
            _remove(cluster, snap.rgw_uid, access)
            row = SnapshotNodeKey.objects.get(**live)
    return snapshot_repository(snap, access_key=row.access_key,
                               secret_key=unseal(row.sealed_secret)["secret_key"])


def _remove(cluster, uid: str, access_key: str) -> str:
    """'' once RGW no longer knows the key, else why not."""
    try:
        ceph_for(cluster).s3_key_remove(uid, access_key)
    except (CephError, CephUnavailable) as exc:
        return str(exc)[:500] or type(exc).__name__
    return ""


def node_key_wanted(row: SnapshotNodeKey) -> bool:
    """Whether the op the key was made for is still sent to its node: the snapshot not
    deleted, the lease live and still on that node, and the op itself not over."""
    snap, lease = row.snapshot, row.lease
    if snap.key_destroyed_at is not None or lease.state not in _LIVE:
        return False
    if not SlotAllocation.objects.filter(lease_id=lease.pk, slot__node_id=row.node_id,
                                         released_at__isnull=True).exists():
        return False
    if row.purpose == SnapshotNodeKey.Purpose.TAKE:
        return snap.state == Snapshot.State.CREATING and snap.source_lease_id == lease.pk
    return lease.restore_from_id == snap.pk and lease.restored_at is None


def snapshot_node_keys_sync(*, now: datetime, snapshot_ids=None, limit: int = 200) -> list[str]:
    """Remove from RGW every node key whose op is no longer sent to its node (at most
    `limit`, the oldest first; a failure is kept and retried by the next pass). Returns
    what it did, for the lifecycle pass's log."""
    rows = (SnapshotNodeKey.objects.filter(revoked_at__isnull=True)
            .select_related("snapshot__site", "lease", "node").order_by("pk"))
    if snapshot_ids is not None:
        rows = rows.filter(snapshot_id__in=list(snapshot_ids))
    done = []
    for row in rows[:limit]:
        if node_key_wanted(row):
            continue
        cluster = cluster_of(row.snapshot.site) if row.snapshot.site_id else None
        error = _remove(cluster, row.snapshot.rgw_uid, row.access_key) if cluster is not None else ""
        if error:
            SnapshotNodeKey.objects.filter(pk=row.pk).update(last_error=error)
            continue
        with transaction.atomic():
            if SnapshotNodeKey.objects.filter(pk=row.pk, revoked_at__isnull=True).update(
                    revoked_at=now, sealed_secret="", last_error=""):
                audit_record(actor=None, action="snapshot_node_key_revoke", obj=row.snapshot,
                             detail={"node": row.node.name, "lease": row.lease_id, "purpose": row.purpose,
                                     "access_key": row.access_key}, at=now)
                done.append(f"snapshot #{row.snapshot_id}: node {row.node.name}'s {row.purpose} key removed")
    return done
