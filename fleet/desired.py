"""A node's desired state (PROTOCOL.md, `GET /agent/v1/desired`), derived from the
database every time: which leases hold slots on the node, their state, the customer's
stop/restart, and the disk key's state. Moving a slot allocation (a migration) therefore
moves the instance: the new node sees the lease `running`, the old one `absent`.

Disk work on the lease's own disk is asked only of the node the lease was on last, and only
once rental asked for it (DiskKey destroy requested; the wipe as soon as the key is destroyed
— `wipe_by` is only the deadline alerts watch, as README and rental.lifecycle promise):
nothing here can destroy a paid lease's disk. A node the lease moved off holds only a copy
(the lease's disk is now elsewhere): it is told to destroy that copy's key, then, once it
proved that, to wipe it and give the device back to its pool — the same two steps and the
same signed evidence as a release, so a move neither strands a drive nor leaves an LV
behind. The copy is listed until its wipe is proven, even once the lease itself is wiped."""
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, Subquery

from inventory.burnin import burn_in_depth, pending_for_node
from inventory.models import Node, SlotAllocation
from nodeagent.signing import fingerprint
from rental.agent import Instance
from rental.models import DiskKey, Lease, LeaseState, Snapshot
from rental.storage import restore_into_pending
from rental.workbench import effective_image_ref, lease_node_env, lease_registry_auth
from storage.models import SnapshotNodeKey
from storage.snapshots import snapshot_node_repository
from storage.volumes import desired_storage, desired_volumes

from .desired_version import desired_stamp, remember_etag
from .models import Evidence, InstanceIntent, IssuedOp
from .pacing import poll_seconds
from .timeutil import rfc3339

S = LeaseState
ON_HOST = (S.PROVISIONING, S.ACTIVE, S.SUSPENDED)
#: /dev/shm as a share of the instance's memory: PyTorch DataLoader workers pass batches
#: through it, and Docker's 64 MB default breaks them.
SHM_SHARE_OF_MEMORY = 4


@dataclass(frozen=True)
class Wanted:
    want: str   # running | stopped | absent
    disk: str   # keep | destroy_key | wipe


#: How far the copy a move left on a node is sanitized (_copies_left_here).
COPY_KEY_PENDING, COPY_KEY_DESTROYED, COPY_WIPED = "", "key_destroyed", "wiped"


def _wanted(lease: Lease, *, here_now: bool, last_here: bool, stopped_by_customer: bool,
            copy: str = COPY_KEY_PENDING) -> Wanted:
    if here_now and lease.state == S.SUSPENDED:
        return Wanted("stopped", "keep")
    if here_now and lease.state in (S.PROVISIONING, S.ACTIVE):
        return Wanted("stopped" if stopped_by_customer and lease.state == S.ACTIVE else "running", "keep")
    if not last_here:
        # Moved to another node: this copy goes — the instance, its disk key, then (once this
        # node proved the key gone) its blocks, and the device returns to the node's pool.
        return Wanted("absent", "wipe" if copy == COPY_KEY_DESTROYED else "destroy_key")
    if lease.state in ON_HOST:
        return Wanted("absent", "destroy_key")
    key_state = lease.disk_key.state
    if key_state == DiskKey.State.DESTROYED:
        return Wanted("absent", "wipe")
    if key_state == DiskKey.State.DESTROY_REQUESTED:
        return Wanted("absent", "destroy_key")
    return Wanted("absent", "keep")


def _leases_on(node: Node):
    """Leases that hold slots on the node now, or held them and are not wiped yet — their
    own disk, or the copy a move left here — with the node each was on last and how far
    that copy is sanitized. Never-started leases (cancelled unpaid) never reached a host.
    Three indexed reads, two more when the node holds copies left by moves (the poll's
    budget: EXPLAIN at 10,000 nodes showed the former OR of an id list and a subquery scanning the
    lease and allocation tables)."""
    current: dict[int, list[int]] = defaultdict(list)
    ids: set[int] = set()
    for lease_id, index, released_at in (SlotAllocation.objects.filter(slot__node=node)
                                         .values_list("lease_id", "slot__index", "released_at")
                                         .order_by("slot__index")):
        ids.add(lease_id)
        if released_at is None:
            current[lease_id].append(index)
    last_node: dict[int, int] = {}
    for lease_id, node_id in (SlotAllocation.objects.filter(lease_id__in=ids)
                              .order_by("lease_id", "-allocated_at", "-id").values_list("lease_id", "slot__node_id")):
        last_node.setdefault(lease_id, node_id)
    copies = _copies_left_here(node, {pk for pk in ids if last_node.get(pk) != node.pk})
    wiped = {pk for pk, state in copies.items() if state == COPY_WIPED}
    # A lease wiped on the node it moved to is still listed here while its copy is not.
    unwiped_copies = [pk for pk in copies if pk not in wiped]
    gone = Q(state=S.WIPED) & ~Q(pk__in=unwiped_copies) if unwiped_copies else Q(state=S.WIPED)
    leases = list(Lease.objects.filter(pk__in=ids - wiped)
                  .exclude(state=S.PENDING).exclude(gone).exclude(provisioning_started_at__isnull=True)
                  .select_related("offer__gpu_model", "image", "disk_key", "restore_from", "registry_credential").order_by("pk")) if ids else []
    for lease in leases:
        lease.last_node_id = last_node.get(lease.pk)
        lease.copy_here = copies.get(lease.pk, COPY_KEY_PENDING)
    return leases, current


def _copies_left_here(node: Node, moved: set[int]) -> dict[int, str]:
    """For each lease that moved off this node: how far the copy it left here is sanitized,
    as this node proved for the op it was last issued for the lease — COPY_KEY_PENDING,
    COPY_KEY_DESTROYED (a `key_destroyed` accepted for that op, or the op already asks for
    the wipe) or COPY_WIPED (a `disk_wiped` with `result: ok` for it: nothing is left here).
    Evidence counts only for the op it answers, so a lease that came back to this node and
    left again starts over with its new copy."""
    if not moved:
        return {}
    issued = {lease_id: (op_id, disk) for lease_id, op_id, disk in
              IssuedOp.objects.filter(node=node, lease_id__in=moved).values_list("lease_id", "op_id", "disk")}
    proven = set(Evidence.objects.filter(node=node, lease_id__in=moved)
                 .filter(Q(kind=Evidence.Kind.KEY_DESTROYED) | Q(kind=Evidence.Kind.DISK_WIPED, record__result="ok"))
                 .values_list("lease_id", "kind", "op_id"))
    out = {}
    for lease_id in moved:
        op_id, disk = issued.get(lease_id, ("", ""))
        if (lease_id, Evidence.Kind.DISK_WIPED, op_id) in proven:
            out[lease_id] = COPY_WIPED
        elif disk == "wipe" or (lease_id, Evidence.Kind.KEY_DESTROYED, op_id) in proven:
            out[lease_id] = COPY_KEY_DESTROYED
        else:
            out[lease_id] = COPY_KEY_PENDING
    return out


def _issue(*, lease: Lease, node: Node, wanted: Wanted, restarts: int, now: datetime,
           known: IssuedOp | None = None) -> str:
    """The op_id for this (want, disk, restarts): the stored one while nothing changed,
    else the next counter. `known` is the row as read without a lock by this poll: when it
    already says the same, the poll writes nothing and takes no lock (a steady
    fleet's polls are reads)."""
    if known is not None and (known.want, known.disk, known.restarts) == (wanted.want, wanted.disk, restarts):
        return known.op_id
    label = wanted.want if wanted.disk == "keep" else wanted.disk
    with transaction.atomic():
        op = IssuedOp.objects.select_for_update().filter(lease=lease, node=node).first()
        if op is None:
            try:
                with transaction.atomic():
                    op = IssuedOp.objects.create(lease=lease, node=node, want=wanted.want, disk=wanted.disk,
                                                 restarts=restarts, counter=1, op_id=f"{lease.pk}:{label}:1",
                                                 issued_at=now)
            except IntegrityError:  # a concurrent poll created it
                op = IssuedOp.objects.select_for_update().get(lease=lease, node=node)
        if (op.want, op.disk, op.restarts) != (wanted.want, wanted.disk, restarts):
            counter = op.counter + 1
            op_id = f"{lease.pk}:{label}:{counter}"
            IssuedOp.objects.filter(pk=op.pk).update(want=wanted.want, disk=wanted.disk, restarts=restarts,
                                                     counter=counter, op_id=op_id, issued_at=now)
            return op_id
        return op.op_id


def _resources(node: Node, gpus: list[int]) -> dict:
    """CPUs and memory in proportion of the node's GPUs the lease holds."""
    n, total = len(gpus), max(node.gpu_count, 1)
    memory_gb = node.host_ram_gb * n // total
    return {"cpus": node.vcpus * n // total, "memory_gb": memory_gb,
            "shm_gb": max(1, memory_gb // SHM_SHARE_OF_MEMORY) if n else 0}


def desired_instances(*, node: Node, now: datetime, clock: list[datetime] | None = None) -> list[dict]:
    """`clock`, when given, receives the moments after `now` at which these instances
    change by time alone (fleet/desired_version.py keeps the ETag only until the first)."""
    leases, current = _leases_on(node)
    intents = {i.lease_id: i for i in InstanceIntent.objects.filter(lease__in=[le.pk for le in leases])}
    volumes = desired_volumes(node=node, lease_ids=list(current))
    issued = {op.lease_id: op for op in IssuedOp.objects.filter(node=node, lease__in=[le.pk for le in leases])}
    snapshots = _snapshots_to_take(list(current))
    out = []
    for lease in leases:
        intent = intents.get(lease.pk)
        gpus = current.get(lease.pk, [])
        wanted = _wanted(lease, here_now=bool(gpus), last_here=lease.last_node_id == node.pk,
                         stopped_by_customer=bool(intent and intent.stopped_by_customer), copy=lease.copy_here)
        snap = snapshots.get(lease.pk)
        if snap is not None and snap.purpose == Snapshot.Purpose.MIGRATION and wanted.want == "running":
            # The lease is moving off this node; it stops, so that the copy the new
            # node restores holds everything written here.
            wanted = Wanted("stopped", wanted.disk)
        if snap is not None and snap.attempt_started_at is not None and snap.attempt_started_at > now:
            if clock is not None:
                clock.append(snap.attempt_started_at)
            snap = None     # its next attempt is not due yet (SNAPSHOT_RETRY_SECONDS)
        restore_into = restore_into_pending(lease) if gpus and lease.restore_from_id else None
        if restore_into is not None and wanted.want == "running":
            wanted = Wanted("stopped", wanted.disk)     # the snapshot replaces the disk while stopped
        restarts = intent.restarts if intent else 0
        out.append({
            "lease_id": lease.pk,
            "op_id": _issue(lease=lease, node=node, wanted=wanted, restarts=restarts, now=now,
                            known=issued.get(lease.pk)),
            "want": wanted.want,
            "disk": wanted.disk,
            "gpus": gpus,
            "image": lease.image.slug,
            "ssh_authorized_keys": [k.strip() for k in lease.ssh_public_key.splitlines() if k.strip()],
            "disk_gb": lease.offer.gpu_model.included_nvme_gb + 1000 * lease.extra_nvme_tb,
            **_resources(node, gpus),
            "volumes": volumes.get(lease.pk, []) if wanted.want == "running" else [],
            **_snapshot_ops(lease, wanted, snap, restore_into, node=node, now=now, clock=clock),
            **_workbench(lease, wanted, runs_here=bool(gpus)),
        })
    return out


def _workbench(lease: Lease, wanted: Wanted, *, runs_here: bool) -> dict:
    """The customer's image, start command, variables, secrets and ports (nodeagent/PROTOCOL.md):
    only for the node that runs the lease now, and only while it keeps an instance there — a
    node holding a copy a move left behind, or asked to remove it, learns none of it, least of
    all the registry password and the secrets. Each field only when set, so a lease without a
    workbench reads as before and an agent that predates these fields sees nothing new."""
    if not runs_here or wanted.want not in ("running", "stopped"):
        return {}
    out = {}
    image_ref = effective_image_ref(lease)
    if image_ref:
        out["image_ref"] = image_ref
        out["image_max_bytes"] = settings.WORKBENCH_IMAGE_MAX_GB * 10**9
        auth = lease_registry_auth(lease)
        if auth is not None:
            out["registry_auth"] = auth
    if lease.start_command:
        out["start_command"] = lease.start_command
    env = lease_node_env(lease)
    if env:
        out["env"] = env
    if lease.ports:
        out["ports"] = [{"port": p["port"], "allow": list(p["allow"])} for p in lease.ports]
    return out


def _snapshots_to_take(lease_ids: list[int]) -> dict[int, Snapshot]:
    """Per lease on the node now: the snapshot being taken (one at a time): a migration's
    first, else the oldest."""
    out: dict[int, Snapshot] = {}
    for snap in (Snapshot.objects.filter(source_lease_id__in=lease_ids, state=Snapshot.State.CREATING,
                                         key_destroyed_at__isnull=True).exclude(repository="")
                 .order_by("-purpose", "created_at", "pk")):
        out.setdefault(snap.source_lease_id, snap)
    return out


def _snapshot_ops(lease: Lease, wanted: Wanted, snap: Snapshot | None, restore_into=None, *, node: Node,
                  now: datetime, clock: list[datetime] | None = None) -> dict:
    """`snapshot` (take this snapshot of the lease's disk) and `restore` (the new
    lease's disk starts from a snapshot, before its instance first starts; or, with
    `replace` and its own op_id, the snapshot replaces a stopped lease's disk). Only the op
    carries the repository's password and an S3 key made for this node and op alone, taken
    back once the op is no longer sent here (ADR 0010); the node keeps them nowhere. When the
    cluster cannot make the key now, the op waits for a later poll."""
    ops = {}
    T, R = SnapshotNodeKey.Purpose.TAKE, SnapshotNodeKey.Purpose.RESTORE

    def repository(source, purpose):
        repo = snapshot_node_repository(snap=source, lease=lease, node=node, purpose=purpose, now=now)
        if repo is None and clock is not None:
            clock.append(now + timedelta(seconds=settings.NODE_POLL_SECONDS))
        return repo

    if snap is not None and wanted.want in ("running", "stopped") and restore_into is None:
        repo = repository(snap, T)
        if repo is not None:
            ops["snapshot"] = {"op_id": snap.op_id, "snapshot_id": snap.pk, "repository": repo}
    source = lease.restore_from
    if restore_into is not None:
        if wanted.want == "stopped" and source.key_destroyed_at is None and source.restic_snapshot:
            repo = repository(source, R)
            if repo is not None:
                ops["restore"] = {"op_id": f"restore:{lease.pk}:{restore_into.pk}", "replace": True,
                                  "snapshot_id": source.pk, "restic_snapshot": source.restic_snapshot,
                                  "repository": repo}
        return ops
    if source is not None and lease.restored_at is None and wanted.want == "running" and \
            source.key_destroyed_at is None and source.restic_snapshot:
        repo = repository(source, R)
        if repo is not None:
            ops["restore"] = {"snapshot_id": source.pk, "restic_snapshot": source.restic_snapshot,
                              "repository": repo}
    return ops


def desired_burn_ins(*, node: Node) -> list[dict]:
    """Diagnostics asked of the node: pending burn-ins on its idle cards."""
    return [{"op_id": b.op_id, "gpu": b.slot.index, "level": settings.BURN_IN_DCGM_LEVEL,
             "depth": burn_in_depth(b)}        # agents before depth run `level`
            for b in pending_for_node(node)]


def desired_etag(document: dict) -> str:
    """A strong validator over everything but the clock: the same desired state, the same
    ETag, so an agent that has it gets `304 Not Modified` (PROTOCOL.md)."""
    unchanging = {k: v for k, v in document.items() if k != "generated_at"}
    digest = hashlib.sha256(json.dumps(unchanging, sort_keys=True, separators=(",", ":")).encode())
    return f'"{digest.hexdigest()[:32]}"'


def desired_document(*, node: Node, now: datetime, clock: list[datetime] | None = None) -> dict:
    return {
        "node": node.name,
        "generated_at": rfc3339(now),
        "poll_seconds": poll_seconds(now),
        "instances": desired_instances(node=node, now=now, clock=clock),
        "burn_in": desired_burn_ins(node=node),
        "storage": desired_storage(node=node),
    }


def desired_answer(*, node: Node, now: datetime, run: str | None = None) -> tuple[dict, str]:
    """The document and its ETag, which is remembered under the node's version as read
    before computing (fleet/desired_version.py): until a change moves that version or the
    clock reaches a moment the document depends on, polls are answered 304 from the cache.
    `run`: the run id of the Redis the poll's round trip reached, if it said."""
    stamp, clock = desired_stamp(node.pk), []
    document = desired_document(node=node, now=now, clock=clock)
    etag = desired_etag(document)
    remember_etag(node.pk, stamp, etag, now, until=min(clock, default=None), run=run)
    return document, etag


def lease_on_node(*, lease_id: int, node: Node) -> bool:
    """The lease held (or holds) slots on this node: the only leases it may report on."""
    return SlotAllocation.objects.filter(lease_id=lease_id, slot__node=node).exists()


def last_node_id(lease_id: int) -> int | None:
    """The node that last held the lease's slots (its disk), even once released."""
    return (SlotAllocation.objects.filter(lease_id=lease_id).order_by("-allocated_at", "-id")
            .values_list("slot__node_id", flat=True).first())


def instance_of(evidence) -> Instance:
    """Customers connect to the node's public host at the port the node reported, and are
    given the fingerprint of the key that signs that node's records."""
    agent = getattr(evidence.node, "agent", None)
    host = getattr(agent, "public_host", "") or evidence.record["host"]
    key = getattr(agent, "public_key", "")
    return Instance(host=host, ssh_port=evidence.record["ssh_port"],
                    node_key_fingerprint=fingerprint(key) if key else "")


def current_node_id(lease_id: int) -> int | None:
    return _held_slots(lease_id).values_list("slot__node_id", flat=True).first()


def current_node(lease_id: int) -> Subquery:
    """current_node_id as a subquery, for a query about the lease on its node."""
    return Subquery(_held_slots(lease_id).values("slot__node_id")[:1])


def _held_slots(lease_id: int):
    return SlotAllocation.objects.filter(lease_id=lease_id, released_at__isnull=True)
