"""`gpu-node-agent verify-record FILE`: check a customer's sanitization record offline
(issue 23). The record (downloaded from the lease page or `GET /api/v1/leases/<id>/
sanitization-record`) holds each proof as the node signed it: `signed` (the exact UTF-8
canonical JSON the Ed25519 signature covers), `signature` and the node's `public_key`
(raw, base64). Anyone can check it with this, or with any Ed25519 implementation:

    python3 - FILE <<'PY'
    import base64, json, sys
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    for p in json.load(open(sys.argv[1]))["proofs"]:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(p["public_key"])).verify(
            base64.b64decode(p["signature"]), p["signed"].encode())   # raises if forged
        print("ok", json.loads(p["signed"])["kind"])
    PY

The key in the file only proves the record is intact; pass `--node-key` (the node's key
as the storefront or the operator publishes it) to prove who signed it."""
import base64
import json
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

FORMAT = "gpu-storefront/sanitization-record/1"
KINDS = ("key_destroyed", "disk_wiped")


@dataclass(frozen=True)
class Checked:
    kind: str
    ok: bool
    summary: str


def verify_record(document: dict, *, node_key: str | None = None) -> list[Checked]:
    """One result per proof; a record with no proof or the wrong format is one failure."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return [Checked("record", False, f"not a sanitization record (format {FORMAT})")]
    proofs = document.get("proofs")
    if not isinstance(proofs, list) or not proofs:
        return [Checked("record", False, "the record holds no proof")]
    return [_check(proof, document.get("lease_id"), node_key) for proof in proofs]


def _check(proof, lease_id, node_key: str | None) -> Checked:
    kind = proof.get("kind", "?") if isinstance(proof, dict) else "?"
    try:
        key_b64, signed = proof["public_key"], proof["signed"]
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(key_b64, validate=True))
        key.verify(base64.b64decode(proof["signature"], validate=True), signed.encode())
        facts = json.loads(signed)
    except (KeyError, TypeError, ValueError, InvalidSignature) as exc:
        return Checked(kind, False, f"signature does not check out ({type(exc).__name__})")
    if node_key and node_key != key_b64:
        return Checked(kind, False, "signed by another key than --node-key")
    if facts.get("kind") != kind or kind not in KINDS or facts.get("lease_id") != lease_id:
        return Checked(kind, False, "the signed facts are not this lease's key destruction/wipe")
    if facts.get("node") != proof.get("node"):
        return Checked(kind, False, "the signed node is not the record's")
    if kind == "key_destroyed":
        ok = facts.get("keyslots_after") == 0 and facts.get("test_passphrase_exit") not in (0, None)
        return Checked(kind, ok, f"node {facts['node']}: LUKS {facts.get('luks_uuid') or '-'} key "
                       f"destroyed at {facts.get('destroyed_at') or facts.get('at')}, keyslots left "
                       f"{facts.get('keyslots_after')}, old key test exit {facts.get('test_passphrase_exit')}")
    verification = facts.get("verification") or {}
    ok = facts.get("result") == "ok" and verification.get("nonzero") == 0
    return Checked(kind, ok, f"node {facts['node']}: {facts.get('device_model')} "
                   f"{facts.get('device_serial')} wiped by {facts.get('method')} "
                   f"({facts.get('nist_category')}), result {facts.get('result')}, "
                   f"{verification.get('samples')} blocks read back, {verification.get('nonzero')} "
                   f"not zero, finished {facts.get('finished_at')}")
