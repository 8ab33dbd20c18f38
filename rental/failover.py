"""Hardware failure: move a lease off a failed node to free slots of the same offer at the
same site, within the promised 30 minutes (SPEC, "Hardware failure"). With the node agent
(fleet), moving the slot allocation is the whole order: the target node's desired state
gets the lease (running), the source's `absent`; the target's instance_ready evidence
replaces the lease's host and port and the customer is told the new connection line.

The local NVMe: when the source node still answers, the move waits for a fresh
copy first — the source stops the instance and snapshots its disk (a `migration` snapshot,
not charged), then the lease moves, the target restores that copy and the copy is deleted
(its key destroyed) once restored. The source's own disk is released as an ended lease's is
— its key destroyed, then wiped and its device returned to the node's pool (fleet/desired.py)
— and never while the copy is being taken: the lease moves only once it settled. When the
source is dead, or its copy is not ready within MIGRATION_SNAPSHOT_WAIT_MINUTES (or fails
for good), the lease moves at once and the target restores the lease's most recent ready
snapshot, and the customer is told exactly which point in time they got back; without any
snapshot the disk starts empty and the event and notice say so. FakeAgent's demo claims it
moves the disk.

Each lease moves in its own transaction (release the old slots, allocate new ones on a
different node); when nothing fits, that transaction rolls back, the lease keeps its old
slots and the caller is told which lease could not move and why."""
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inventory.incidents import downtime_end_for_lease
from inventory.models import Downtime, Incident, Node, SlotAllocation
from inventory.services import SoldOut, slots_allocate, slots_release

from .agent import get_agent
from .events import event_record as _event
from .models import LIVE_STATES, Lease, LeaseEvent, Snapshot

MIGRATION_TARGET = timedelta(minutes=30)


class MigrationRefused(Exception):
    """This lease cannot be moved; the message says why."""


@dataclass
class MigrationReport:
    moved: list[dict] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    copying: list[dict] = field(default_factory=list)   # the source copies the disk first

    @property
    def summary(self) -> str:
        parts = []
        if self.copying:
            parts.append("Copying the disk first (the source node answers): " + ", ".join(
                f"lease #{m['lease_id']} off {m['from_node']} (snapshot #{m['snapshot']})" for m in self.copying)
                + "; each moves once its copy is ready or its wait is over.")
        if self.moved:
            parts.append("Moved " + ", ".join(
                f"lease #{m['lease_id']} {m['from_node']} → {m['to_node']} in {m['seconds'] // 60} min"
                f"{'' if m['within_target'] else ' (over the 30-minute target)'}" for m in self.moved) + ".")
        if self.refused:
            parts.append("Could not move " + "; ".join(f"lease #{pk}: {why}" for pk, why in self.refused) + ".")
        return " ".join(parts) or "No live lease on that hardware."


@transaction.atomic
def lease_migrate(*, lease_id: int, from_node: Node, now: datetime | None = None, actor=None,
                  failed_since: datetime | None = None, reason: str = "hardware failure", copy=None) -> dict:
    """Move one lease's allocation off `from_node`. Raises MigrationRefused (nothing changed).

    `copy`: None, decide — a source that answers first snapshots the disk and the move
    waits for it (returns `{"pending": True, ...}`; migration_snapshot_settled finishes
    it); the ready migration Snapshot, restore it; False, no fresh copy could be had:
    restore the latest ready snapshot."""
    now = now or timezone.now()
    lease = Lease.objects.select_for_update().select_related("offer__gpu_model", "site", "customer").get(pk=lease_id)
    if lease.state not in LIVE_STATES:
        raise MigrationRefused(f"it is {lease.get_state_display()}")
    old = list(SlotAllocation.objects.filter(lease_id=lease_id, released_at__isnull=True)
               .select_related("slot__node"))
    if not any(a.slot.node_id == from_node.pk for a in old):
        raise MigrationRefused(f"it holds no slot on {from_node.name}")
    if failed_since is None:
        first_down = (Downtime.objects.filter(lease_id=lease_id, ends_at__isnull=True)
                      .order_by("starts_at").values_list("starts_at", flat=True).first())
        failed_since = first_down or now
    agent = get_agent()
    copies_disk = getattr(agent, "copies_disk_on_migration", True)
    if copy is None and not copies_disk and hasattr(agent, "node_answers") and \
            agent.node_answers(node=from_node, now=now):
        pending = _copy_first(lease, from_node=from_node, agent=agent, now=now, failed_since=failed_since,
                              reason=reason, actor=actor)
        if pending is not None:
            return pending
    try:
        with transaction.atomic():
            slots_release(lease_id=lease_id)
            new = slots_allocate(offer=lease.offer, site=lease.site, lease_id=lease_id,
                                 exclude_node_ids=[from_node.pk])
    except SoldOut:
        raise MigrationRefused(_no_target(lease)) from None
    to_node = new[0].node
    fresh = isinstance(copy, Snapshot) and copy.state == Snapshot.State.AVAILABLE
    if copies_disk:
        restored = None
    elif fresh:
        restored = _restore_snapshot(lease, copy, now=now, why="migration: fresh copy of the source node's disk")
    else:
        restored = _restore_latest_snapshot(lease, now=now)
    seconds = max(0, int((now - failed_since).total_seconds()))
    data = {
        "from_node": from_node.name, "to_node": to_node.name,
        "from_slots": [a.slot_id for a in old], "to_slots": [s.pk for s in new],
        "failed_since": failed_since.isoformat(), "completed_at": now.isoformat(), "seconds": seconds,
        "within_target": seconds <= MIGRATION_TARGET.total_seconds(),
        "nvme": ("local NVMe (LUKS2 volume, same key ref) moved with the instance" if copies_disk else
                 f"local NVMe copied off the source node (instance stopped, snapshot #{restored.pk} of "
                 f"{restored.ready_at.isoformat()}) and restored on the target node; the source's copy is "
                 f"destroyed" if fresh else
                 f"new local NVMe on the target node, restored from snapshot #{restored.pk} of "
                 f"{restored.ready_at.isoformat()}; the failed node's copy is destroyed" if restored else
                 "new local NVMe on the target node; the failed node's copy is destroyed (not copied)"),
        "restored_snapshot": ({"snapshot": restored.pk, "taken_at": restored.ready_at.isoformat(), "fresh": fresh}
                              if restored else None),
        "extra_nvme_tb": lease.extra_nvme_tb,
    }
    _event(lease_id, kind="migrated", now=now, actor=actor, from_state=lease.state, to_state=lease.state,
           reason=reason, data=data)
    downtime_end_for_lease(lease_id=lease_id, at=now)
    _notify_moved(lease, data, new_address_follows=not copies_disk, restored=restored, fresh=fresh, now=now)
    # A pull-model agent needs no call: the moved allocation is the target node's desired
    # state, and its instance_ready evidence gives the lease its new connection line.
    if hasattr(agent, "migrate"):
        transaction.on_commit(lambda: agent.migrate(lease_id=lease_id, from_node=from_node.name,
                                                    to_node=to_node.name))
    return {"lease_id": lease_id, **data}


def _no_target(lease: Lease) -> str:
    return (f"no other node at {lease.site.code} has {lease.offer.gpu_count} free "
            f"{lease.offer.gpu_model.name} slot(s) in service")


def _copy_first(lease: Lease, *, from_node: Node, agent, now: datetime, failed_since: datetime, reason: str,
                actor) -> dict | None:
    """The source answers: it snapshots the disk before the lease moves. The pending move
    (dict), or None when no copy can be taken here (no snapshot storage, the lease not
    snapshottable): the lease moves at once with its latest snapshot."""
    under_way = Snapshot.objects.filter(source_lease=lease, purpose=Snapshot.Purpose.MIGRATION,
                                        state=Snapshot.State.CREATING).first()
    if under_way is not None:
        return {"lease_id": lease.pk, "pending": True, "snapshot": under_way.pk, "from_node": from_node.name}
    try:        # a target must exist before the instance is stopped for the copy
        with transaction.atomic():
            slots_release(lease_id=lease.pk)
            slots_allocate(offer=lease.offer, site=lease.site, lease_id=lease.pk, exclude_node_ids=[from_node.pk])
            raise _TargetFree
    except SoldOut:
        raise MigrationRefused(_no_target(lease)) from None
    except _TargetFree:
        pass
    snap = agent.migration_snapshot_take(lease=lease, now=now)
    if snap is None:
        return None
    wait_until = now + timedelta(minutes=settings.MIGRATION_SNAPSHOT_WAIT_MINUTES)
    data = {"from_node": from_node.name, "snapshot": snap.pk, "failed_since": failed_since.isoformat(),
            "wait_until": wait_until.isoformat()}
    _event(lease.pk, kind="migration_snapshot", now=now, actor=actor, from_state=lease.state, to_state=lease.state,
           reason=reason, data=data)
    _notify_copying(lease, snap, wait_until=wait_until, now=now)
    return {"lease_id": lease.pk, "pending": True, **data}


class _TargetFree(Exception):
    """Rolls back the trial allocation of _copy_first."""


def migration_snapshot_settled(*, snapshot_id: int, now: datetime) -> dict | None:
    """The move's copy is ready (restore it) or failed for good, or the wait is over
    (restore the latest ready snapshot): the pending move happens now. Called by
    rental.storage in the transaction that settled the snapshot."""
    snap = Snapshot.objects.get(pk=snapshot_id)
    event = (LeaseEvent.objects.filter(lease_id=snap.source_lease_id, kind="migration_snapshot",
                                       data__snapshot=snap.pk).order_by("-at", "-pk").first())
    if event is None or LeaseEvent.objects.filter(lease_id=snap.source_lease_id, kind__in=["migrated",
                                                  "migration_refused"], at__gte=event.at, pk__gt=event.pk).exists():
        return None
    from_node = Node.objects.get(name=event.data["from_node"])
    try:
        return lease_migrate(lease_id=snap.source_lease_id, from_node=from_node, now=now, reason=event.reason,
                             failed_since=datetime.fromisoformat(event.data["failed_since"]),
                             copy=snap if snap.state == Snapshot.State.AVAILABLE else False)
    except MigrationRefused as exc:
        _event(snap.source_lease_id, kind="migration_refused", now=now, reason=str(exc)[:300],
               data={"snapshot": snap.pk, "from_node": from_node.name})
        return None


def migration_snapshots_overdue(*, now: datetime, limit: int = 500) -> list[Snapshot]:
    """Moves whose copy was not ready within MIGRATION_SNAPSHOT_WAIT_MINUTES."""
    before = now - timedelta(minutes=settings.MIGRATION_SNAPSHOT_WAIT_MINUTES)
    return list(Snapshot.objects.filter(purpose=Snapshot.Purpose.MIGRATION, state=Snapshot.State.CREATING,
                                        created_at__lte=before).order_by("created_at", "pk")[:limit])


def _restore_snapshot(lease: Lease, snap, *, now: datetime, why: str):
    Lease.objects.filter(pk=lease.pk).update(restore_from=snap, restored_at=None)
    _event(lease.pk, kind="restore_from_snapshot", now=now,
           data={"snapshot": snap.pk, "taken_at": snap.ready_at.isoformat(), "reason": why})
    return snap


def _restore_latest_snapshot(lease: Lease, *, now: datetime):
    """The new node's disk starts from the lease's most recent ready snapshot (or
    the one it was ordered from), never silently empty; None when there is none."""
    candidates = Snapshot.objects.filter(state=Snapshot.State.AVAILABLE, key_destroyed_at__isnull=True,
                                         site=lease.site).exclude(restic_snapshot="")
    own = candidates.filter(source_lease=lease).order_by("-ready_at", "-pk").first()
    ordered_from = candidates.filter(pk=lease.restore_from_id).first() if lease.restore_from_id else None
    snap = max((s for s in (own, ordered_from) if s is not None), key=lambda s: s.ready_at, default=None)
    if snap is None:
        return None
    return _restore_snapshot(lease, snap, now=now, why="migration")


def _notify_copying(lease: Lease, snap, *, wait_until: datetime, now: datetime) -> None:
    from django.utils.translation import gettext as _

    from .notifications.notices import customer_language, notify

    with customer_language(lease.customer):
        args = {"id": lease.pk, "offer": lease.offer, "snap": snap.pk, "until": f"{wait_until:%Y-%m-%d %H:%M}"}
        subject = _("Lease #%(id)s (%(offer)s) is moving to other hardware") % args
        body = _("Your lease #%(id)s moves to working hardware. Its instance is stopped now and its local NVMe is "
                 "copied (snapshot #%(snap)s); the new server restores the copy before your instance starts "
                 "there, and its connection line follows in another notice. If the copy is not ready by "
                 "%(until)s UTC, the lease moves with your most recent snapshot instead, and we tell you its "
                 "time.") % args
    notify(lease=lease, kind="migration_copy", deadline=now, subject=subject, body=body, now=now)


def _notify_moved(lease: Lease, data: dict, *, new_address_follows: bool, now: datetime, restored=None,
                  fresh: bool = False) -> None:
    """The follow-up the incident notice promised. With the node agent the instance answers
    at the target node's address once it is ready there: that line comes in the
    connection-changed notice (rental.services.lease_connection_update); an agent that moves
    the instance as it is (FakeAgent) keeps the line, given here."""
    from django.utils.translation import gettext as _

    from .notifications.notices import customer_language, notify

    args = {"id": lease.pk, "offer": lease.offer, "at": f"{now:%Y-%m-%d %H:%M}", "minutes": data["seconds"] // 60,
            "command": lease.ssh_command}
    with customer_language(lease.customer):
        subject = _("Lease #%(id)s (%(offer)s) moved to working hardware") % args
        body = _("Your instance of lease #%(id)s was moved to working hardware at %(at)s UTC, %(minutes)s min after "
                 "the failure; its downtime has ended.") % args
        if new_address_follows and fresh:
            body += " " + _("Its local NVMe was copied off the old server after the instance stopped (snapshot "
                            "#%(snap)s, %(taken)s UTC) and is restored on the new server before your instance "
                            "starts: nothing written before the stop is lost. Its new connection line follows in "
                            "another notice as soon as the instance is ready there.") % {
                "snap": restored.pk, "taken": f"{restored.ready_at:%Y-%m-%d %H:%M:%S}"}
        elif new_address_follows and restored is not None:
            body += " " + _("The local NVMe of the failed server could not be copied: the new server's disk starts "
                            "from your most recent snapshot #%(snap)s, taken at %(taken)s UTC. Files written after "
                            "that time are not on it. Its new connection line follows in another notice as soon as "
                            "the instance is ready there.") % {"snap": restored.pk,
                                                               "taken": f"{restored.ready_at:%Y-%m-%d %H:%M:%S}"}
        elif new_address_follows:
            body += " " + _("The local NVMe was not copied: the new server starts with an empty local disk (network "
                            "volumes and snapshots are kept). Its new connection line follows in another notice as "
                            "soon as the instance is ready there.")
        elif lease.ssh_command:
            body += " " + _("Connect with: %(command)s") % args
    notify(lease=lease, kind="migrated", deadline=now, subject=subject, body=body, now=now)


def _migrate_all(pairs: list[tuple[int, Node]], *, now, actor, reason) -> MigrationReport:
    report = MigrationReport()
    # Multi-GPU leases first: whole free nodes are the scarce target.
    sizes = dict(Lease.objects.filter(pk__in=[p for p, _ in pairs]).values_list("pk", "offer__gpu_count"))
    for lease_id, node in sorted(pairs, key=lambda p: (-sizes.get(p[0], 1), p[0])):
        try:
            result = lease_migrate(lease_id=lease_id, from_node=node, now=now, actor=actor, reason=reason)
            (report.copying if result.get("pending") else report.moved).append(result)
        except MigrationRefused as exc:
            report.refused.append((lease_id, str(exc)))
    return report


def node_evacuate(*, node: Node, actor=None, now: datetime | None = None,
                  reason: str = "node failed: migrated by operator") -> MigrationReport:
    """Every live lease on `node` to another node at the same site."""
    lease_ids = sorted(set(SlotAllocation.objects.filter(slot__node=node, released_at__isnull=True)
                           .values_list("lease_id", flat=True)))
    return _migrate_all([(pk, node) for pk in lease_ids], now=now or timezone.now(), actor=actor, reason=reason)


def incident_migrate(*, incident: Incident, actor=None, now: datetime | None = None) -> MigrationReport:
    """Every lease still down in an open incident, off the node it sits on."""
    if incident.ends_at is not None:
        raise MigrationRefused(f"incident #{incident.pk} is closed")
    if incident.site_id:
        raise MigrationRefused(f"the whole site {incident.site.code} is down: no target at the same site")
    down = set(Downtime.objects.filter(incident=incident, ends_at__isnull=True).values_list("lease_id", flat=True))
    allocs = (SlotAllocation.objects.filter(lease_id__in=down, released_at__isnull=True)
              .select_related("slot__node").order_by("lease_id"))
    pairs = {a.lease_id: a.slot.node for a in allocs}
    return _migrate_all(sorted(pairs.items()), now=now or timezone.now(), actor=actor,
                        reason=f"incident #{incident.pk}: {incident.reason}"[:300])


def incident_notify_customers(*, incident: Incident, now: datetime | None = None) -> int:
    """Tell every customer whose live lease is on the incident's hardware: what is down
    since when, that downtime counts toward the SLA, and that a failed node's leases are
    moved. Once per lease and incident (the notice's deadline is the incident's start)."""
    from django.utils.translation import gettext as _

    from .notifications.notices import customer_language, notify

    lease_ids = Downtime.objects.filter(incident=incident).values_list("lease_id", flat=True)
    leases = Lease.objects.filter(pk__in=list(lease_ids), state__in=LIVE_STATES).select_related("customer", "offer__gpu_model")
    sent = 0
    for lease in leases:
        args = {"id": lease.pk, "offer": lease.offer, "since": f"{incident.starts_at:%Y-%m-%d %H:%M}"}
        with customer_language(lease.customer):
            subject = _("Lease #%(id)s (%(offer)s): hardware out of service since %(since)s UTC") % args
            body = _("The hardware of your lease #%(id)s is out of service since %(since)s UTC. The time it is "
                     "down counts toward your SLA credit. If a server failed, we move your instance to "
                     "working hardware and send you its new connection line.") % args
        sent += notify(lease=lease, kind="incident", deadline=incident.starts_at, subject=subject, body=body, now=now)
    return sent
