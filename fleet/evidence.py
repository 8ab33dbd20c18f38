"""Signed evidence from a node (PROTOCOL.md, "Evidence records"): checked field by field,
verified with the node's registered Ed25519 key over its canonical JSON, stored verbatim,
then applied — instance_ready makes the lease active (or moves its connection line),
key_destroyed completes the DiskKey's destruction, disk_wiped wipes the lease or, when the
wipe failed, quarantines the node; for the copy a move left on a node, both are written on
the lease (rental.disk_keys.lease_copy_sanitized) and a failed wipe quarantines that node.
Evidence counts only for what the storefront asked of that node (the op it issued: running,
destroy_key, wipe), so a node cannot destroy a paid lease's disk, nor start an unpaid one,
by claiming it did."""
import logging
from datetime import datetime

from django.db import IntegrityError, transaction

from inventory.incidents import incident_open
from inventory.models import Incident
from inventory.services import node_set_draining
from rental.addresses import valid_host, valid_port
from rental.agent import agent_override
from rental.disk_keys import disk_key_complete_destroy, lease_copy_sanitized
from rental.models import DiskKey, Lease, Snapshot
from rental.services import lease_connection_update, lease_provisioned, lease_wipe
from rental.storage import lease_restored, snapshot_ready
from storage.snapshots import snapshot_node_keys_sync

from .crypto import canonical_json, signature_valid
from .desired import current_node_id, instance_of, last_node_id, lease_on_node
from .driver import NodeAgentDriver, proof_text
from .models import Evidence, IssuedOp, NodeAgent
from .timeutil import parse_time

log = logging.getLogger(__name__)


class Refused(Exception):
    """This evidence item is refused (never stored nor applied); the code says why."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


def _int(value, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise Refused("invalid")
    return value


def _str(value, max_len: int = 200) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise Refused("invalid")
    return value


int_field, str_field = _int, _str   # for the other signed records (fleet/burnin.py)
def _check_address(record: dict) -> None:
    """The host and port an instance is reached at become the customer's ssh
    line, so they are a host name or an IP address and a port number, nothing else."""
    if valid_host(record.get("host")) is None or valid_port(record.get("ssh_port")) is None:
        raise Refused("invalid_address")


def _check_commands(record: dict) -> None:
    commands = record.get("commands")
    if not isinstance(commands, list) or len(commands) > 100:
        raise Refused("invalid")
    for command in commands:
        if not isinstance(command, dict) or not isinstance(command.get("argv"), list):
            raise Refused("invalid")
        _int(command.get("exit"), -(2**31), 2**31)


def _check_kind_fields(kind: str, record: dict) -> None:
    if kind == Evidence.Kind.INSTANCE_READY:
        _check_address(record)
    elif kind in SNAPSHOT_KINDS:
        _int(record.get("snapshot_id"), 1, 2**62)
        _str(record.get("restic_snapshot"), 80)
        _int(record.get("bytes"), 0, 2**62)
        if kind == Evidence.Kind.SNAPSHOT_TAKEN:
            _int(record.get("stored_bytes"), 0, 2**62)
    elif kind == Evidence.Kind.KEY_DESTROYED:
        _check_commands(record)
        if _int(record.get("keyslots_after"), 0, 64) != 0 or _int(record.get("test_passphrase_exit"), -255, 255) == 0:
            raise Refused("not_proven")  # the old key still opens the volume
        _check_gpu_memory(record)
    else:
        _check_commands(record)
        if record.get("result") not in ("ok", "failed"):
            raise Refused("invalid")
        verification = record.get("verification")
        if record["result"] == "ok" and not _verified(verification):
            raise Refused("not_proven")


MAX_GPUS_PER_RECORD = 64    # far above any node's GPU count: a bound, not a limit in use


def _check_gpu_memory(record: dict) -> None:
    """`gpu_memory_cleared` (absent from agents that predate it): per GPU the lease used on
    the node, whether its memory was overwritten and read back. An `ok` is proven as a wipe
    is (verified, some bytes); a `failed` is accepted and quarantines the node."""
    cleared = record.get("gpu_memory_cleared")
    if cleared is None:
        return
    if not isinstance(cleared, dict) or len(cleared) > MAX_GPUS_PER_RECORD:
        raise Refused("invalid")
    for uuid, entry in cleared.items():
        _str(uuid, 80)
        if not isinstance(entry, dict) or entry.get("result") not in ("ok", "failed") or \
                type(entry.get("verified")) is not bool:
            raise Refused("invalid")
        _int(entry.get("bytes"), 0, 2**62)
        _int(entry.get("total_bytes"), 0, 2**62)
        if entry["result"] == "ok" and not (entry["verified"] and entry["bytes"] > 0):
            raise Refused("not_proven")


def _verified(verification) -> bool:
    """Sampled blocks read back as the method promises: all zero after an overwrite or a
    zeroing sanitize (a crypto erase reads back as noise, so only the sampling is required)."""
    if not isinstance(verification, dict) or type(verification.get("samples")) is not int:
        return False
    if verification.get("pattern", "zero") == "zero":
        return verification.get("nonzero") == 0 and verification["samples"] > 0
    return verification["samples"] > 0


SNAPSHOT_KINDS = (Evidence.Kind.SNAPSHOT_TAKEN, Evidence.Kind.SNAPSHOT_RESTORED)


def _snapshot_asked(*, lease_id: int, node_id: int, record: dict) -> None:
    """`snapshot_taken` answers the snapshot op this node was sent: the lease's snapshot
    being taken, on the node the lease is on now."""
    snap = Snapshot.objects.filter(pk=record["snapshot_id"], source_lease_id=lease_id).first()
    if snap is None or snap.op_id != record["op_id"] or current_node_id(lease_id) != node_id:
        raise Refused("not_requested")


def _restore_into_asked(*, lease_id: int, node_id: int, op_id: str) -> None:
    """`snapshot_restored` of a restore into an existing lease answers the pending one, on
    the node the lease is on now (op_id `restore:<lease>:<event>`, fleet.desired)."""
    from rental.storage import restore_into_pending

    lease = Lease.objects.filter(pk=lease_id).first()
    pending = restore_into_pending(lease) if lease is not None else None
    if pending is None or op_id != f"restore:{lease_id}:{pending.pk}" or current_node_id(lease_id) != node_id:
        raise Refused("not_requested")


def _asked(*, lease_id: int, node_id: int, kind: str, op_id: str) -> None:
    """The record names the op the storefront issued for this lease on this node, and that
    op asks for what the evidence proves: a running instance, the key's destruction, the
    wipe. An older op of the lease (re-sent, e.g. an old `instance_ready` that would move
    the connection line back) is `stale_op`; any other op or kind is `not_requested`."""
    issued = IssuedOp.objects.filter(lease_id=lease_id, node_id=node_id).values("want", "disk", "op_id").first()
    if issued is None:
        raise Refused("not_requested")
    if op_id != issued["op_id"]:
        raise Refused("stale_op" if _earlier_op(op_id, issued["op_id"]) else "not_requested")
    want, disk = issued["want"], issued["disk"]
    if kind in (Evidence.Kind.INSTANCE_READY, Evidence.Kind.SNAPSHOT_RESTORED):
        asked = want == "running"
    elif kind == Evidence.Kind.KEY_DESTROYED:
        asked = disk in ("destroy_key", "wipe")
    else:
        asked = disk == "wipe"
    if not asked:
        raise Refused("not_requested")


def _earlier_op(op_id: str, current: str) -> bool:
    """op_ids are `<lease>:<label>:<counter>` (fleet.desired._issue)."""
    head, _, counter = op_id.rpartition(":")
    now_head, _, now_counter = current.rpartition(":")
    same_lease = head.partition(":")[0] == now_head.partition(":")[0]
    return same_lease and counter.isdigit() and now_counter.isdigit() and int(counter) < int(now_counter)


def evidence_accept(*, agent: NodeAgent, record, now: datetime) -> Evidence:
    """Verify, store and apply one record; raises Refused with a code."""
    if not isinstance(record, dict):
        raise Refused("invalid")
    kind = record.get("kind")
    if kind not in Evidence.Kind.values:
        raise Refused("unknown_kind")
    lease_id = _int(record.get("lease_id"), 1, 2**62)
    op_id = _str(record.get("op_id"), 80)
    at = parse_time(record.get("at"))
    signature = _str(record.get("signature"), 120)
    if at is None:
        raise Refused("invalid")
    if record.get("node") != agent.node.name:
        raise Refused("wrong_node")
    if not lease_on_node(lease_id=lease_id, node=agent.node):
        raise Refused("unknown_lease")
    if not signature_valid(public_key=agent.public_key, signature=signature, message=canonical_json(record)):
        raise Refused("bad_signature")
    _check_kind_fields(kind, record)
    if kind == Evidence.Kind.SNAPSHOT_TAKEN:
        _snapshot_asked(lease_id=lease_id, node_id=agent.node_id, record=record)
    elif kind == Evidence.Kind.SNAPSHOT_RESTORED and op_id.startswith("restore:"):
        _restore_into_asked(lease_id=lease_id, node_id=agent.node_id, op_id=op_id)
    else:
        _asked(lease_id=lease_id, node_id=agent.node_id, kind=kind, op_id=op_id)
    if kind == Evidence.Kind.SNAPSHOT_RESTORED and not Lease.objects.filter(
            pk=lease_id, restore_from_id=record["snapshot_id"]).exists():
        raise Refused("not_requested")
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    with transaction.atomic():
        try:
            with transaction.atomic():
                evidence = Evidence.objects.create(node=agent.node, lease_id=lease_id, kind=kind, op_id=op_id, at=at,
                                                   received_at=now, record=unsigned, signature=signature,
                                                   signed_text=canonical_json(record).decode())
        except IntegrityError:  # sent again (the agent resends until accepted): counted once
            evidence = Evidence.objects.get(node=agent.node, lease_id=lease_id, kind=kind, op_id=op_id)
            if evidence.signature != signature:
                raise Refused("conflicting_evidence") from None
            return evidence
        _apply(evidence, agent=agent, now=now)
    return evidence


def _snapshot_keys_take_back(snapshot_id: int, now: datetime) -> None:
    try:
        snapshot_node_keys_sync(now=now, snapshot_ids=[snapshot_id])
    except Exception:  # noqa: BLE001 - the proof is recorded whatever the cluster says; the sweep retries
        log.exception("snapshot #%s: node keys not taken back after its op", snapshot_id)


def _apply(evidence: Evidence, *, agent: NodeAgent, now: datetime) -> None:
    lease_id = evidence.lease_id
    if evidence.kind in (Evidence.Kind.SNAPSHOT_TAKEN, Evidence.Kind.SNAPSHOT_RESTORED):
        snapshot_id = evidence.record["snapshot_id"]
        if evidence.kind == Evidence.Kind.SNAPSHOT_TAKEN:
            snapshot_ready(snapshot_id=snapshot_id, op_id=evidence.op_id, facts=evidence.record, now=now)
        else:
            lease_restored(lease_id=lease_id, snapshot_id=snapshot_id, facts=evidence.record, now=now)
        # The op is done: the node's key for it is taken back now (the storage sweep retries).
        transaction.on_commit(lambda: _snapshot_keys_take_back(snapshot_id, now))
        return
    if evidence.kind == Evidence.Kind.INSTANCE_READY:
        if current_node_id(lease_id) != agent.node_id:
            return  # kept as a record; an old node's instance never takes the connection line back
        instance = instance_of(evidence)
        if not lease_provisioned(lease_id=lease_id, instance=instance, now=now):
            lease_connection_update(lease_id=lease_id, instance=instance, now=now,
                                    reason=f"instance ready on node {agent.node.name}")
        return
    if evidence.kind == Evidence.Kind.KEY_DESTROYED:
        _apply_gpu_memory(evidence, agent=agent, now=now)   # this node's GPUs, whichever copy
    if last_node_id(lease_id) != agent.node_id:
        _apply_to_copy(evidence, agent=agent, now=now)
        return
    with agent_override(NodeAgentDriver()):
        if evidence.kind == Evidence.Kind.KEY_DESTROYED:
            if DiskKey.objects.filter(lease_id=lease_id, state=DiskKey.State.DESTROY_REQUESTED).exists():
                disk_key_complete_destroy(lease_id=lease_id, now=now)
        elif evidence.record.get("result") == "ok":
            lease_wipe(lease_id=lease_id, now=now)
        else:
            node_quarantine(agent=agent, evidence=evidence, now=now)


def _apply_to_copy(evidence: Evidence, *, agent: NodeAgent, now: datetime) -> None:
    """A copy a move left on this node (the lease's own disk is elsewhere): its key
    destroyed, or its blocks wiped, is written on the lease with the node-signed receipt —
    the audit row, and what the lease's sanitization record shows of that copy. The lease's
    own key and state are untouched. A failed wipe quarantines the node, as after a release:
    its drive is not handed to the next lease."""
    ok = evidence.kind == Evidence.Kind.KEY_DESTROYED or evidence.record.get("result") == "ok"
    lease_copy_sanitized(lease_id=evidence.lease_id, node=agent.node.name, kind=evidence.kind, ok=ok,
                         receipt=proof_text(evidence), now=now)
    if not ok:
        node_quarantine(agent=agent, evidence=evidence, now=now)


def _apply_gpu_memory(evidence: Evidence, *, agent: NodeAgent, now: datetime) -> None:
    """A GPU whose memory was not cleared after the lease may still hold its data: the node
    is quarantined as after a failed wipe (no new lease), until an operator has the card
    cleared (the agent fails the card's burn-in until a clear succeeds)."""
    entries = evidence.record.get("gpu_memory_cleared") or {}
    failed = sorted(uuid for uuid, entry in entries.items() if entry["result"] != "ok")
    if not failed:
        return
    what = f"GPU memory not cleared after lease #{evidence.lease_id}"
    node_set_draining(node=agent.node, draining=True, reason=what)
    detail = str(entries[failed[0]].get("detail") or "")[:120]
    incident_open(node=agent.node, kind=Incident.Kind.DEGRADED, starts_at=now, now=now,
                  source=Incident.Source.HEALTH_CHECK,
                  reason=f"quarantined: {what} ({', '.join(failed)[:200]}) {detail}".strip())


def node_quarantine(*, agent: NodeAgent, evidence: Evidence, now: datetime) -> Incident:
    """A failed wipe: the node takes no new leases and an incident says why, until an
    operator has the disk sanitized or replaced."""
    node_set_draining(node=agent.node, draining=True, reason=f"disk wipe failed for lease #{evidence.lease_id}")
    detail = str(evidence.record.get("detail") or evidence.record.get("method") or "")[:120]
    return incident_open(node=agent.node, kind=Incident.Kind.DEGRADED, starts_at=now, now=now,
                         source=Incident.Source.HEALTH_CHECK,
                         reason=f"quarantined: disk wipe failed for lease #{evidence.lease_id} {detail}".strip())
