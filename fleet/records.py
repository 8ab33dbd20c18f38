"""The customer's sanitization record of a lease (SPEC: "a signed record the customer can
download"): the node-signed proofs that the disk's key was destroyed and the disk
wiped, each with the node's Ed25519 public key, so that anyone can check them offline
(`gpu-node-agent verify-record FILE`, nodeagent/records.py). The proofs are the receipts
rental stored when it accepted them (DiskKey.destruction_proof, the `wiped` event), as
the node signed them, plus the key destruction and the wipe of each copy a move left on
another node."""
import json
from dataclasses import dataclass, replace
from datetime import datetime

from django.db.models import Q

from nodeagent.records import unwiped
from rental.models import DiskKey, Lease

from .driver import proof_text
from .models import Evidence
from .timeutil import rfc3339

FORMAT = "gpu-storefront/sanitization-record/1"   # nodeagent.records.FORMAT

#: What the proofs are about, stated exactly (the printable page and the privacy page say the
#: same in the reader's language). The agent's Docker runtime puts the instance's writable
#: layer and its container files on the lease's LUKS2 disk and keeps no logs
#: (nodeagent/runtime/instance_root.py); network volumes and snapshots are apart (README.md,
#: "Storage", "Snapshots of lease disks").
COVERS = {
    "on_the_encrypted_disk": [
        "the instance's whole writable root file system: the overlay upper directory, i.e. everything "
        "written outside /workspace (/root and its pip and Hugging Face caches, /tmp, /var/tmp, /home, "
        "/opt, installed packages)",
        "the container's files /etc/hosts, /etc/resolv.conf and /etc/hostname",
        "/workspace",
    ],
    "not_kept": ["container logs (stdout and stderr): Docker's log driver is \"none\""],
    "in_ram_only": ["/dev/shm and every other tmpfs of the instance: RAM, gone when the instance stops"],
    "gpu_memory": "cleared by the node agent before the card's next lease wherever the driver does not "
                  "guarantee it; the key_destroyed proof of a release says so per GPU in gpu_memory_cleared "
                  "(proofs made before the agent recorded it have none)",
    "not_covered": [
        "the node's RAM while it is powered (what a running instance holds in memory)",
        "network volumes (CephFS on the operator's storage cluster): not on this disk and not encrypted "
        "with its key; they stay until you delete them",
        "snapshots (restic repositories in object storage): encrypted with their own password, destroyed "
        "(password forgotten, objects purged) when deleted, not by this record",
        "the read-only layers of the image the instance started from (the public image: no tenant data)",
    ],
}


@dataclass(frozen=True)
class Proof:
    kind: str
    node: str
    public_key: str
    signed: str
    signature: str
    facts: dict
    copy: bool = False      # of the copy a move left on that node, not the lease's last disk


def _proof(receipt: str | None, kind: str) -> Proof | None:
    """A stored receipt (fleet.driver.proof_text); None for one that is not a node's signed
    proof (e.g. the FakeAgent's, or a never-provisioned lease's note)."""
    try:
        data = json.loads(receipt or "")
        facts = json.loads(data["signed"])
    except (ValueError, KeyError, TypeError):
        return None
    if facts.get("kind") != kind:
        return None
    return Proof(kind=kind, node=data["node"], public_key=data["public_key"], signed=data["signed"],
                 signature=data["signature"], facts=facts)


def record_proofs(lease: Lease) -> list[Proof]:
    """The lease's own disk (its key, then its wipe), then each copy a move left on another
    node (its key, then its wipe, in the order the nodes proved them)."""
    try:
        key = lease.disk_key           # joined by the lease page's read of the lease
    except DiskKey.DoesNotExist:
        key = None
    proofs = [_proof(key.destruction_proof if key else None, "key_destroyed")]
    wiped = (lease.events_of("wiped") or [None])[-1]
    proofs.append(_proof((wiped.data or {}).get("receipt") if wiped else None, "disk_wiped"))
    own = {p.signature for p in proofs if p}
    copies = (Evidence.objects.filter(lease=lease).exclude(signature__in=own)
              .filter(Q(kind=Evidence.Kind.KEY_DESTROYED) | Q(kind=Evidence.Kind.DISK_WIPED, record__result="ok"))
              .select_related("node__agent").order_by("received_at", "id"))
    proofs += [replace(p, copy=True) for p in (_proof(proof_text(e), e.kind) for e in copies) if p]
    return [p for p in proofs if p]


def proofs_unwiped(proofs: list[Proof]) -> list[Proof]:
    """The key destructions whose disk no wipe proof of the same node answers (the wipe still
    pending): the same rule as `gpu-node-agent verify-record`'s MISSING."""
    left = unwiped([(p.kind, p.facts) for p in proofs])
    return [p for p in proofs if p.kind == "key_destroyed" and any(p.facts is f for f in left)]


def sanitization_record(lease: Lease, *, now: datetime) -> dict | None:
    """The downloadable record, or None while no key destruction was proven yet. Only the
    proofs are signed (by the nodes); `covers` is the storefront's statement of what the
    encrypted disk held, and `disk` says which disk each proof is about."""
    proofs = record_proofs(lease)
    if not proofs:
        return None
    return {"format": FORMAT, "lease_id": lease.pk, "generated_at": rfc3339(now), "algorithm": "Ed25519",
            "verify_with": "gpu-rent verify-record FILE --node-key-fingerprint <each server's key fingerprint, "
                           "given when the lease started>",
            "covers": COVERS,
            "proofs": [{"kind": p.kind, "node": p.node, "disk": "moved_copy" if p.copy else "lease",
                        "public_key": p.public_key, "signed": p.signed, "signature": p.signature} for p in proofs]}
