"""The customer's sanitization record of a lease (SPEC: "a signed record the customer can
download"; issue 23): the node-signed proofs that the disk's key was destroyed and the disk
wiped, each with the node's Ed25519 public key, so that anyone can check them offline
(`gpu-node-agent verify-record FILE`, nodeagent/records.py). The proofs are the receipts
rental stored when it accepted them (DiskKey.destruction_proof, the `wiped` event), as
the node signed them, plus the key destruction of any copy a migration left on another
node."""
import json
from dataclasses import dataclass
from datetime import datetime

from rental.models import DiskKey, Lease

from .driver import proof_text
from .models import Evidence
from .timeutil import rfc3339

FORMAT = "gpu-storefront/sanitization-record/1"   # nodeagent.records.FORMAT


@dataclass(frozen=True)
class Proof:
    kind: str
    node: str
    public_key: str
    signed: str
    signature: str
    facts: dict


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
    key = DiskKey.objects.filter(lease=lease).first()
    proofs = [_proof(key.destruction_proof if key else None, "key_destroyed")]
    wiped = lease.events.filter(kind="wiped").order_by("-at", "-pk").first()
    proofs.append(_proof((wiped.data or {}).get("receipt") if wiped else None, "disk_wiped"))
    own = {p.signature for p in proofs if p}
    copies = (Evidence.objects.filter(lease=lease, kind=Evidence.Kind.KEY_DESTROYED).exclude(signature__in=own)
              .select_related("node__agent").order_by("received_at", "id"))
    proofs += [_proof(proof_text(e), "key_destroyed") for e in copies]
    return [p for p in proofs if p]


def sanitization_record(lease: Lease, *, now: datetime) -> dict | None:
    """The downloadable record, or None while no key destruction was proven yet."""
    proofs = record_proofs(lease)
    if not proofs:
        return None
    return {"format": FORMAT, "lease_id": lease.pk, "generated_at": rfc3339(now), "algorithm": "Ed25519",
            "verify_with": "gpu-node-agent verify-record FILE",
            "proofs": [{"kind": p.kind, "node": p.node, "public_key": p.public_key, "signed": p.signed,
                        "signature": p.signature} for p in proofs]}
