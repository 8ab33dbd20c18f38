"""Network volumes and snapshots: every write here, audited (LeaseEvent for what touches a
lease, AuditEntry otherwise). Money is billing's (billing.ops charges each term from the
balance and calls these). Extra local NVMe is a lease add-on (Lease.extra_nvme_tb): it is
renewed and released with the lease."""
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils.translation import gettext as _

from inventory.models import Site
from inventory.services import audit_record

from .models import Lease, LeaseState, NetworkVolume, Snapshot, VolumeAttachment
from .sealing import seal, unseal
from .services import _event

S = LeaseState
RUNNING = (S.PROVISIONING, S.ACTIVE)


class StorageRefused(Exception):
    """Not allowed; the message says why."""


@transaction.atomic
def volume_create(*, customer, site: Site, name: str, size_tb: int, paid_until: datetime, now: datetime
                  ) -> NetworkVolume:
    if size_tb < 1:
        raise StorageRefused("A network volume is at least 1 TB.")
    volume = NetworkVolume.objects.create(customer=customer, site=site, name=name[:60] or "volume", size_tb=size_tb,
                                          created_at=now, paid_until=paid_until)
    audit_record(actor=customer, action="volume_create", obj=volume, detail={"site": site.code, "size_tb": size_tb})
    return volume


@transaction.atomic
def volume_attach(*, volume: NetworkVolume, lease: Lease, now: datetime, actor=None) -> VolumeAttachment:
    volume = NetworkVolume.objects.select_for_update().get(pk=volume.pk)
    if volume.state != NetworkVolume.State.ACTIVE:
        raise StorageRefused(f"Volume {volume.name} is {volume.get_state_display()}.")
    if lease.customer_id != volume.customer_id:
        raise StorageRefused("The volume and the lease belong to different customers.")
    if lease.site_id != volume.site_id:
        raise StorageRefused(f"Volume {volume.name} is at another site; it attaches only to leases at its site.")
    if lease.state not in RUNNING:
        raise StorageRefused(f"Lease #{lease.pk} is {lease.get_state_display()}.")
    attachment, created = VolumeAttachment.objects.get_or_create(
        volume=volume, lease=lease, detached_at=None, defaults={"attached_at": now})
    if created:
        _event(lease.pk, kind="volume_attached", now=now, actor=actor, from_state=lease.state, to_state=lease.state,
               data={"volume": volume.pk, "size_tb": volume.size_tb})
    return attachment


@transaction.atomic
def volume_detach(*, volume: NetworkVolume, lease_id: int, now: datetime, actor=None, reason="detached") -> int:
    changed = VolumeAttachment.objects.filter(volume=volume, lease_id=lease_id, detached_at__isnull=True).update(
        detached_at=now)
    if changed:
        _event(lease_id, kind="volume_detached", now=now, actor=actor, reason=reason, data={"volume": volume.pk})
    return changed


def attachments_of_ended_leases_detach(*, now: datetime, limit: int = 500) -> int:
    """A released lease lets go of its volumes; the volumes themselves survive. At most
    `limit` attachments per call (the sweep's batch); the next pass takes the rest."""
    dead = (VolumeAttachment.objects.filter(detached_at__isnull=True)
            .exclude(lease__state__in=[S.PENDING, S.PROVISIONING, S.ACTIVE, S.SUSPENDED])
            .select_related("volume").order_by("pk")[:limit])
    return sum(volume_detach(volume=a.volume, lease_id=a.lease_id, now=now, reason="lease ended") for a in dead)


@transaction.atomic
def storage_extend(*, obj, paid_until: datetime, new_until: datetime) -> bool:
    """Guarded on the old end, so each term is extended once."""
    return bool(type(obj).objects.filter(pk=obj.pk, paid_until=paid_until).update(paid_until=new_until))


@transaction.atomic
def storage_lapse(*, obj, now: datetime) -> bool:
    live = NetworkVolume.State.ACTIVE if isinstance(obj, NetworkVolume) else Snapshot.State.AVAILABLE
    if not type(obj).objects.filter(pk=obj.pk, state=live).update(state="lapsed"):
        return False
    if isinstance(obj, NetworkVolume):
        for a in VolumeAttachment.objects.filter(volume=obj, detached_at__isnull=True):
            volume_detach(volume=obj, lease_id=a.lease_id, now=now, reason="volume unpaid")
    audit_record(actor=None, action="storage_lapse", obj=obj, detail={"paid_until": obj.paid_until.isoformat()},
                 at=now)
    return True


@transaction.atomic
def storage_delete(*, obj, now: datetime, actor=None, reason: str) -> bool:
    if not type(obj).objects.filter(pk=obj.pk).exclude(state="deleted").update(state="deleted", deleted_at=now):
        return False
    if isinstance(obj, NetworkVolume):
        for a in VolumeAttachment.objects.filter(volume=obj, detached_at__isnull=True):
            volume_detach(volume=obj, lease_id=a.lease_id, now=now, reason="volume deleted")
    audit_record(actor=actor, action="storage_delete", obj=obj, detail={"reason": reason}, at=now)
    if isinstance(obj, Snapshot):
        snapshot_key_destroy(snapshot_id=obj.pk, now=now, actor=actor)
    return True


@transaction.atomic
def snapshot_take(*, lease: Lease, size_tb: int, paid_until: datetime, now: datetime, actor=None) -> Snapshot:
    """The row, then its repository at the lease's site (issue 26): `creating` until the
    node proves the copy (snapshot_ready); on a site whose storage is simulated (demo,
    tests without Ceph) nothing is copied and the row is ready at once, as simulated
    volumes are."""
    from billing.storage.snapshots import snapshot_repository_open

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


def snapshot_repository(snap: Snapshot) -> dict:
    """What the node needs to write or read the snapshot (sent only in its op)."""
    sealed = unseal(snap.sealed_secrets)
    return {"url": snap.repository, "access_key": snap.access_key, "secret_key": sealed["secret_key"],
            "password": sealed["password"]}


@transaction.atomic
def snapshot_progress(*, snapshot_id: int, op_id: str, report: dict, now: datetime) -> bool:
    """The node's report while it copies: progress, or the named failure it will retry."""
    snap = Snapshot.objects.select_for_update().filter(pk=snapshot_id, state=Snapshot.State.CREATING).first()
    if snap is None or snap.op_id != op_id:
        return False
    error = report.get("error") if isinstance(report.get("error"), dict) else None
    if error is not None:
        error = {"code": str(error.get("code", ""))[:40], "detail": str(error.get("detail") or "")[:500],
                 "at": now.isoformat()}
    progress = {k: report[k] for k in ("bytes_done", "total_bytes", "percent")
                if type(report.get(k)) in (int, float) and report[k] >= 0}
    progress["state"] = str(report.get("state", ""))[:10]
    if error and (snap.error or {}).get("code") != error["code"]:
        audit_record(actor=None, action="snapshot_failed_retrying", obj=snap, detail=error, at=now)
    Snapshot.objects.filter(pk=snap.pk).update(progress=progress, error=error or snap.error)
    return True


@transaction.atomic
def snapshot_ready(*, snapshot_id: int, op_id: str, facts: dict, now: datetime) -> bool:
    """The node's signed `snapshot_taken`: the copy exists, with its stored size."""
    snap = Snapshot.objects.select_for_update().filter(pk=snapshot_id, state=Snapshot.State.CREATING).first()
    if snap is None or snap.op_id != op_id:
        return False
    Snapshot.objects.filter(pk=snap.pk).update(
        state=Snapshot.State.AVAILABLE, ready_at=now, restic_snapshot=str(facts["restic_snapshot"])[:80],
        content_bytes=int(facts["bytes"]), stored_bytes=int(facts["stored_bytes"]), progress=None, error=None)
    _event(snap.source_lease_id, kind="snapshot_ready", now=now,
           data={"snapshot": snap.pk, "stored_bytes": int(facts["stored_bytes"])})
    audit_record(actor=None, action="snapshot_ready", obj=snap,
                 detail={"restic_snapshot": facts["restic_snapshot"], "bytes": facts["bytes"],
                         "stored_bytes": facts["stored_bytes"]}, at=now)
    return True


@transaction.atomic
def snapshot_key_destroy(*, snapshot_id: int, now: datetime, actor=None) -> bool:
    """Purge the snapshot's objects (its RGW user) and forget its password and key: nothing
    can read it any more. Recorded like a lease's key destruction."""
    from billing.storage.snapshots import snapshot_objects_purge

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


@transaction.atomic
def snapshot_restore(*, snapshot: Snapshot, target: Lease, now: datetime, actor=None) -> None:
    """Restore onto another of the customer's leases in the same region."""
    if snapshot.state != Snapshot.State.AVAILABLE:
        raise StorageRefused(f"Snapshot #{snapshot.pk} is {snapshot.get_state_display()}.")
    if target.customer_id != snapshot.customer_id:
        raise StorageRefused("The snapshot and the lease belong to different customers.")
    if target.site.region != snapshot.region:
        raise StorageRefused(f"Snapshot #{snapshot.pk} is in region {snapshot.region}; lease #{target.pk} is in "
                             f"{target.site.region}.")
    if target.state not in RUNNING:
        raise StorageRefused(f"Lease #{target.pk} is {target.get_state_display()}.")
    _event(target.pk, kind="snapshot_restored", now=now, actor=actor, from_state=target.state, to_state=target.state,
           data={"snapshot": snapshot.pk, "from_lease": snapshot.source_lease_id})


def snapshot_restore_check(*, snapshot: Snapshot, customer, site, disk_bytes: int) -> None:
    """A new lease may start from this snapshot (issue 26): the customer's, ready, at the
    same site (its repository is that site's RGW), and no larger than the new disk.
    Checked at ordering, before anything is created or paid."""
    if snapshot.customer_id != customer.pk:
        raise StorageRefused(_("That snapshot is not yours."))
    if snapshot.state != Snapshot.State.AVAILABLE or snapshot.key_destroyed_at is not None:
        raise StorageRefused(_("Snapshot #%(id)d is %(state)s; only a ready snapshot can be restored.")
                             % {"id": snapshot.pk, "state": snapshot.get_state_display()})
    if snapshot.site_id != site.pk:
        raise StorageRefused(_("Snapshot #%(id)d is stored at %(there)s; a lease at %(here)s cannot start from "
                               "it.") % {"id": snapshot.pk, "there": snapshot.site.code if snapshot.site_id else "?", "here": site.code})
    if (snapshot.content_bytes or 0) > disk_bytes:
        raise StorageRefused(_("Snapshot #%(id)d holds %(need)s GB, more than this lease's %(have)s GB disk: "
                               "add extra NVMe or choose a larger machine.")
                             % {"id": snapshot.pk, "need": -(-(snapshot.content_bytes or 0) // 10**9),
                                "have": disk_bytes // 10**9})


@transaction.atomic
def lease_restore_from_set(*, lease: Lease, snapshot: Snapshot, now: datetime, actor=None) -> None:
    """The new lease's disk starts as a copy of the snapshot (restored by its node before
    the instance first starts)."""
    Lease.objects.filter(pk=lease.pk, restore_from__isnull=True).update(restore_from=snapshot)
    lease.restore_from = snapshot
    _event(lease.pk, kind="restore_from_snapshot", now=now, actor=actor,
           data={"snapshot": snapshot.pk, "from_lease": snapshot.source_lease_id})


@transaction.atomic
def lease_restored(*, lease_id: int, snapshot_id: int, facts: dict, now: datetime) -> bool:
    """The node's signed `snapshot_restored`: the lease's disk holds the snapshot."""
    if not Lease.objects.filter(pk=lease_id, restore_from_id=snapshot_id, restored_at__isnull=True).update(
            restored_at=now):
        return False
    _event(lease_id, kind="snapshot_restored", now=now,
           data={"snapshot": snapshot_id, "bytes": facts.get("bytes"), "restic_snapshot": facts.get("restic_snapshot")})
    return True


def storage_due(*, now: datetime, limit: int = 500):
    """Volumes and snapshots whose paid term has ended, at most `limit` of each."""
    return (list(NetworkVolume.objects.filter(state=NetworkVolume.State.ACTIVE, paid_until__lte=now)
                 .order_by("paid_until")[:limit])
            + list(Snapshot.objects.filter(state=Snapshot.State.AVAILABLE, paid_until__lte=now)
                   .order_by("paid_until")[:limit]))


def storage_expired(*, before: datetime, limit: int = 500):
    """Lapsed volumes and snapshots past their grace, at most `limit` of each."""
    q = Q(state="lapsed", paid_until__lte=before)
    return (list(NetworkVolume.objects.filter(q).order_by("paid_until")[:limit])
            + list(Snapshot.objects.filter(q).order_by("paid_until")[:limit]))
