"""Network volumes and snapshots: every write here, audited (LeaseEvent for what touches a
lease, AuditEntry otherwise). Money is billing's (storage.charges charges each term from the
balance and calls these). Extra local NVMe is a lease add-on (Lease.extra_nvme_tb): it is
renewed and released with the lease."""
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q
from django.dispatch import Signal
from django.utils.translation import gettext as _

from core.sealing import unseal
from inventory.audit import audit_record
from inventory.models import Site

from .agent import agent_is_fake
from .events import event_record as _event
from .models import (
    Lease,
    LeaseState,
    NetworkVolume,
    Snapshot,
    VolumeAttachment,
    snapshot_failure_text,
)

S = LeaseState
RUNNING = (S.PROVISIONING, S.ACTIVE)


class StorageRefused(Exception):
    """Not allowed; the message says why."""


#: Sent after the commit of a lease's end with the volumes it let go of (`volume_ids`),
#: so that storage takes the node's access to them away at once.
lease_volumes_released = Signal()
#: A snapshot was deleted: storage, which owns the cluster, purges its objects and
#: forgets its key, inside the deleting transaction (sent, not on commit).
snapshot_deleted = Signal()
#: A snapshot failed for good (its last attempt failed), sent after the commit with
#: `snapshot_id`: nothing was stored as a snapshot (billing may refund its term).
snapshot_failed = Signal()


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


def lease_volumes_detach(*, lease_id: int, now: datetime, reason: str) -> list[int]:
    """The lease ended (cancelled, released, failed): its volumes are detached now, not at
    the next sweep; the volumes themselves survive. Returns the volumes let go of."""
    return leases_volumes_detach(lease_ids=[lease_id], now=now, reason=reason)


def leases_volumes_detach(*, lease_ids: list[int], now: datetime, reason: str) -> list[int]:
    """`lease_volumes_detach` for a batch of ended leases: one query finds the attachments
    (most leases have none)."""
    attached = list(VolumeAttachment.objects.filter(lease_id__in=list(lease_ids), detached_at__isnull=True)
                    .order_by("lease_id", "volume_id").values_list("lease_id", "volume_id"))
    if not attached:
        return []
    volumes = NetworkVolume.objects.in_bulk([volume_id for _, volume_id in attached])
    by_lease: dict[int, list[int]] = {}
    for lease_id, volume_id in attached:
        by_lease.setdefault(lease_id, []).append(volume_id)
        if volume_id in volumes:
            volume_detach(volume=volumes[volume_id], lease_id=lease_id, now=now, reason=reason)
    for lease_id, ids in by_lease.items():
        transaction.on_commit(lambda lease_id=lease_id, ids=ids: lease_volumes_released.send(
            sender=Lease, lease_id=lease_id, volume_ids=ids, now=now))
    return [volume_id for _, volume_id in attached]


@transaction.atomic
def lease_volume_addon_settled(*, lease_id: int, cents: int, now: datetime, outcome: str) -> None:
    """The order's network volume add-on is settled (created: from now on the volume is
    renewed on its own term from the balance; or refunded): the lease's renewals no longer
    include it, so its price drops by the add-on's part."""
    lease = Lease.objects.select_for_update().get(pk=lease_id)
    cents = min(cents, lease.price_cents - 1)  # a price stays positive (database constraint)
    if cents <= 0:
        return
    Lease.objects.filter(pk=lease_id).update(price_cents=F("price_cents") - cents)
    audit_record(actor=None, action="lease_volume_addon_settled", obj=lease,
                 detail={"price_cents_before": lease.price_cents, "price_cents": lease.price_cents - cents,
                         "outcome": outcome}, at=now)


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
        snapshot_deleted.send(sender=Snapshot, snapshot_id=obj.pk, now=now, actor=actor)
        if obj.purpose == Snapshot.Purpose.MIGRATION:
            # A move waiting for this copy goes ahead without it (latest ready snapshot).
            from .failover import migration_snapshot_settled

            migration_snapshot_settled(snapshot_id=obj.pk, now=now)
    return True


def snapshot_repository(snap: Snapshot, *, access_key: str | None = None, secret_key: str | None = None) -> dict:
    """What the node needs to write or read the snapshot (sent only in its op): with the
    node's own key where one is given (storage.snapshots.snapshot_node_repository),
    else the snapshot's."""
    sealed = unseal(snap.sealed_secrets)
    if access_key is None:
        access_key, secret_key = snap.access_key, sealed["secret_key"]
    return {"url": snap.repository, "access_key": access_key, "secret_key": secret_key,
            "password": sealed["password"]}


@transaction.atomic
def snapshot_progress(*, snapshot_id: int, op_id: str, report: dict, now: datetime) -> bool:
    """The node's report on the snapshot's current attempt: progress (the attempt is alive
    while its bytes move), or the named failure that ends the attempt."""
    snap = Snapshot.objects.select_for_update().filter(pk=snapshot_id, state=Snapshot.State.CREATING).first()
    if snap is None or snap.op_id != op_id:
        return False
    error = report.get("error") if isinstance(report.get("error"), dict) else None
    state = str(report.get("state", ""))[:10]
    if state == "failed" and error is not None:
        return snapshot_attempt_failed(snapshot_id=snap.pk, op_id=op_id, code=str(error.get("code") or "")[:40],
                                       detail=str(error.get("detail") or "")[:500], now=now)
    progress = {k: report[k] for k in ("bytes_done", "total_bytes", "percent")
                if type(report.get(k)) in (int, float) and report[k] >= 0}
    progress["state"] = state
    before = snap.progress or {}
    moved = (progress.get("bytes_done"), state) != (before.get("bytes_done"), before.get("state"))
    Snapshot.objects.filter(pk=snap.pk).update(progress=progress, alive_at=now if moved else snap.alive_at)
    return True


@transaction.atomic
def snapshot_attempt_failed(*, snapshot_id: int, op_id: str, code: str, detail: str, now: datetime,
                            final: bool = False) -> bool:
    """The snapshot's current attempt failed (the node said so, or it timed out): an audit
    row, then the next attempt (a new op_id, sent SNAPSHOT_RETRY_SECONDS from now), or,
    after SNAPSHOT_ATTEMPTS (or `final`), the snapshot is `failed` with the reason, the
    customer is told, and nothing half-copied is ever shown as ready."""
    from django.conf import settings

    snap = Snapshot.objects.select_for_update().filter(pk=snapshot_id, state=Snapshot.State.CREATING).first()
    if snap is None or snap.op_id != op_id:
        return False
    error = {"code": code, "detail": detail, "at": now.isoformat(), "attempt": snap.attempt}
    audit_record(actor=None, action="snapshot_attempt_failed", obj=snap, detail=error, at=now)
    if not final and snap.attempt < settings.SNAPSHOT_ATTEMPTS:
        due = now + timedelta(seconds=settings.SNAPSHOT_RETRY_SECONDS)
        Snapshot.objects.filter(pk=snap.pk).update(attempt=snap.attempt + 1, attempt_started_at=due, alive_at=None,
                                                   progress=None, error=error)
        audit_record(actor=None, action="snapshot_retry", obj=snap,
                     detail={"attempt": snap.attempt + 1, "of": settings.SNAPSHOT_ATTEMPTS, "due": due.isoformat(),
                             "after": code}, at=now)
        _event(snap.source_lease_id, kind="snapshot_retry", now=now,
               data={"snapshot": snap.pk, "attempt": snap.attempt + 1, "failed": code})
        return True
    Snapshot.objects.filter(pk=snap.pk).update(state=Snapshot.State.FAILED, progress=None, error=error)
    snap.refresh_from_db()
    audit_record(actor=None, action="snapshot_failed", obj=snap,
                 detail={**error, "attempts": snap.attempt, "purpose": snap.purpose}, at=now)
    _event(snap.source_lease_id, kind="snapshot_failed", now=now,
           data={"snapshot": snap.pk, "attempts": snap.attempt, "code": code})
    if snap.purpose == Snapshot.Purpose.CUSTOMER:
        _notify_snapshot_failed(snap, now=now)
    transaction.on_commit(lambda: snapshot_failed.send(sender=Snapshot, snapshot_id=snap.pk, now=now))
    if snap.purpose == Snapshot.Purpose.MIGRATION:
        from .failover import migration_snapshot_settled

        migration_snapshot_settled(snapshot_id=snap.pk, now=now)
    return True


def _notify_snapshot_failed(snap: Snapshot, *, now: datetime) -> None:
    from .notifications.notices import customer_language, notify

    lease = Lease.objects.select_related("customer", "offer__gpu_model").get(pk=snap.source_lease_id)
    with customer_language(lease.customer):
        args = {"id": snap.pk, "lease": lease.pk, "attempts": snap.attempt, "why": snapshot_failure_text(snap.error)}
        subject = _("Snapshot #%(id)s of lease #%(lease)s failed") % args
        body = _("Snapshot #%(id)s of lease #%(lease)s could not be taken after %(attempts)s attempts: %(why)s. "
                 "Nothing was stored as a snapshot; your lease's disk is unchanged. Delete the failed snapshot on "
                 "the storage page or take a new one.") % args
    notify(lease=lease, kind="snapshot_failed", deadline=snap.created_at, subject=subject, body=body, now=now)


@transaction.atomic
def snapshot_purpose_migration(*, snapshot: Snapshot, now: datetime) -> Snapshot:
    """The snapshot is the copy a migration moves (rental.failover): not charged, never
    renewed, deleted once the new node restored it."""
    Snapshot.objects.filter(pk=snapshot.pk).update(purpose=Snapshot.Purpose.MIGRATION)
    audit_record(actor=None, action="snapshot_for_migration", obj=snapshot,
                 detail={"lease": snapshot.source_lease_id}, at=now)
    snapshot.refresh_from_db()
    return snapshot


def snapshot_attempts_stalled(*, now: datetime, limit: int = 500) -> list[Snapshot]:
    """Snapshots whose current attempt the node has not reported progress on for
    SNAPSHOT_STALLED_MINUTES (counted from the attempt's start while none came)."""
    from django.conf import settings
    from django.db.models.functions import Coalesce

    before = now - timedelta(minutes=settings.SNAPSHOT_STALLED_MINUTES)
    return list(Snapshot.objects.filter(state=Snapshot.State.CREATING, key_destroyed_at__isnull=True)
                .exclude(repository="")
                .annotate(alive=Coalesce("alive_at", "attempt_started_at", "created_at"))
                .filter(alive__lte=before).order_by("alive", "pk")[:limit])


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
           data={"snapshot": snap.pk, "stored_bytes": int(facts["stored_bytes"]), "attempt": snap.attempt})
    audit_record(actor=None, action="snapshot_ready", obj=snap,
                 detail={"restic_snapshot": facts["restic_snapshot"], "bytes": facts["bytes"],
                         "stored_bytes": facts["stored_bytes"], "attempt": snap.attempt}, at=now)
    if snap.purpose == Snapshot.Purpose.MIGRATION:
        from .failover import migration_snapshot_settled

        migration_snapshot_settled(snapshot_id=snap.pk, now=now)
    return True


def snapshot_restore_check(*, snapshot: Snapshot, customer, site, disk_bytes: int) -> None:
    """A new lease may start from this snapshot: the customer's, ready, at the
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


RESTORE_INTO = "snapshot_restore_requested"


def restore_into_pending(lease: Lease):
    """The customer's pending restore into this existing lease's disk (its LeaseEvent),
    else None. Its restore op_id is `restore:<lease>:<event>`."""
    if lease.restore_from_id is None or lease.restored_at is not None:
        return None
    last = (lease.events.filter(kind__in=[RESTORE_INTO, "restore_from_snapshot", "snapshot_restored"])
            .order_by("-at", "-pk").first())      # a later move's restore is not the customer's
    if last is None or last.kind != RESTORE_INTO or (last.data or {}).get("snapshot") != lease.restore_from_id:
        return None
    return last


@transaction.atomic
def lease_restore_into(*, lease: Lease, snapshot: Snapshot, now: datetime, actor=None):
    """The snapshot replaces what the lease's existing disk holds, on whichever
    node of the site the lease is. The caller (fleet.services.instance_restore) has checked
    that the instance is stopped; checked here: the customer's ready snapshot at the lease's
    site, no larger than the lease's disk, no other restore under way."""
    lease = Lease.objects.select_for_update().select_related("offer__gpu_model", "site").get(pk=lease.pk)
    if lease.state not in (S.ACTIVE, S.SUSPENDED):
        raise StorageRefused(_("Lease #%(id)d is %(state)s: nothing can be restored into it.")
                             % {"id": lease.pk, "state": lease.get_state_display()})
    # A simulated snapshot (no copy of anything) is restored only where the whole store pretends
    # (the demo's FakeAgent): behind real nodes, "restoring" it would change nothing on the disk.
    simulated = snapshot.repository == ""
    if simulated and not agent_is_fake() or not simulated and not snapshot.restic_snapshot:
        raise StorageRefused(_("Snapshot #%(id)d holds no copy of a disk yet.") % {"id": snapshot.pk})
    disk_bytes = (lease.offer.gpu_model.included_nvme_gb + 1000 * lease.extra_nvme_tb) * 10**9
    snapshot_restore_check(snapshot=snapshot, customer=lease.customer, site=lease.site, disk_bytes=disk_bytes)
    if restore_into_pending(lease) is not None:
        raise StorageRefused(_("A restore into lease #%(id)d is already under way.") % {"id": lease.pk})
    Lease.objects.filter(pk=lease.pk).update(restore_from=snapshot, restored_at=None)
    event = _event(lease.pk, kind=RESTORE_INTO, now=now, actor=actor, from_state=lease.state, to_state=lease.state,
                   data={"snapshot": snapshot.pk, "from_lease": snapshot.source_lease_id,
                         "taken_at": snapshot.ready_at.isoformat() if snapshot.ready_at else None})
    audit_record(actor=actor, action="snapshot_restore_into", obj=snapshot,
                 detail={"lease": lease.pk, "event": event.pk}, at=now)
    if simulated:   # simulated storage (the demo): no node copies anything, so the restore is done at once
        lease_restored(lease_id=lease.pk, snapshot_id=snapshot.pk, facts={"bytes": snapshot.content_bytes}, now=now)
    return event


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
    snap = Snapshot.objects.filter(pk=snapshot_id, purpose=Snapshot.Purpose.MIGRATION).first()
    if snap is not None:    # the move's own copy has done its work: destroyed, recorded
        storage_delete(obj=snap, now=now, reason="migration copy restored on the new node")
    return True


def storage_due(*, now: datetime, limit: int = 500):
    """Volumes whose paid term has ended, at most `limit`. (Snapshots have no term: they are
    billed in arrears by what they store, storage.snapshot_usage.)"""
    return list(NetworkVolume.objects.filter(state=NetworkVolume.State.ACTIVE, paid_until__lte=now)
                .order_by("paid_until", "pk")[:limit])


def storage_expired(*, before: datetime, limit: int = 500):
    """Lapsed volumes past their grace, at most `limit` (unpaid snapshots: snapshot_usage)."""
    q = Q(state="lapsed", paid_until__lte=before)
    return list(NetworkVolume.objects.filter(q).order_by("paid_until", "pk")[:limit])
