"""rental.agent.HostAgent for the pull model (settings.HOST_AGENT =
"fleet.driver.NodeAgentDriver", the production default). Nothing is pushed to a node: its
desired state is derived from the database (fleet.desired), so starting, stopping and
resuming need no call. What rental asks back is answered from the signed evidence nodes
sent: an instance is ready, a key is destroyed, a disk is wiped only once a verified
record says so — until then None, "not yet, retry on the next pass"."""
import json
from datetime import datetime

from rental.agent import Instance
from rental.models import Lease

from .desired import current_node_id, instance_of, last_node_id
from .models import Evidence


def proof_text(evidence: Evidence) -> str:
    """The record as the node signed it (`signed`: the exact UTF-8 text the signature
    covers), its signature and the node's key that checks it — verifiable by anyone."""
    public_key = getattr(getattr(evidence.node, "agent", None), "public_key", "")
    return json.dumps({"record": evidence.record, "signed": evidence.signed_text, "signature": evidence.signature,
                       "public_key": public_key, "node": evidence.node.name, "algorithm": "Ed25519"},
                      sort_keys=True, ensure_ascii=False)


def _latest(lease_id: int, node_id: int | None, kind: str, **record) -> Evidence | None:
    if node_id is None:
        return None
    found = Evidence.objects.filter(lease_id=lease_id, node_id=node_id, kind=kind).select_related("node__agent")
    for key, value in record.items():
        found = found.filter(**{f"record__{key}": value})
    return found.order_by("-received_at", "-id").first()


class NodeAgentDriver:
    #: The local NVMe is not copied on a migration: the new node starts with a fresh disk.
    copies_disk_on_migration = False

    def node_answers(self, *, node, now: datetime) -> bool:
        """The node's agent reported within NODE_REPORT_STALE_AFTER (a migration then has it
        snapshot the disk first)."""
        from django.conf import settings

        from .models import NodeAgent

        last = NodeAgent.objects.filter(node=node, credential_hash__isnull=False).values_list(
            "last_report_at", flat=True).first()
        return last is not None and now - last <= settings.NODE_REPORT_STALE_AFTER

    def migration_snapshot_take(self, *, lease, now: datetime):
        """A snapshot of the lease's disk, for its move: its own repository at the
        lease's site, not charged (deleted once the new node restored it). None when the
        site has no snapshot storage."""
        from rental.storage import StorageRefused, snapshot_purpose_migration
        from storage.snapshots import snapshot_take
        from storage.volumes import StorageUnavailable

        disk_gb = lease.offer.gpu_model.included_nvme_gb + 1000 * lease.extra_nvme_tb
        try:
            snap = snapshot_take(lease=lease, size_tb=max(1, -(-disk_gb // 1000)), paid_until=now, now=now)
        except (StorageUnavailable, StorageRefused):
            return None
        if not snap.repository:         # simulated storage: nothing would be copied
            return None
        return snapshot_purpose_migration(snapshot=snap, now=now)

    def start_provisioning(self, *, lease_id, node, ssh_public_key, key_ref):
        return None  # the node sees the paid lease in its desired state on its next poll

    def stop(self, *, lease_id):
        return None

    def resume(self, *, lease_id):
        return None

    def poll_ready(self, *, lease_id: int, started_at: datetime, now: datetime) -> Instance | None:
        evidence = _latest(lease_id, current_node_id(lease_id), Evidence.Kind.INSTANCE_READY)
        return instance_of(evidence) if evidence else None

    def destroy_key(self, *, lease_id: int, key_ref: str, at: datetime) -> str | None:
        if Lease.objects.filter(pk=lease_id, provisioning_started_at__isnull=True).exists():
            return (f"never-provisioned:{lease_id}:{at.isoformat()}: the lease was never paid, no node ever "
                    "created its disk")
        evidence = _latest(lease_id, last_node_id(lease_id), Evidence.Kind.KEY_DESTROYED)
        return proof_text(evidence) if evidence else None

    def wipe(self, *, lease_id: int, at: datetime) -> str | None:
        evidence = _latest(lease_id, last_node_id(lease_id), Evidence.Kind.DISK_WIPED, result="ok")
        return proof_text(evidence) if evidence else None
