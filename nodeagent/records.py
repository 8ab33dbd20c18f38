"""`gpu-node-agent verify-record FILE`: check a customer's sanitization record offline.
The record (downloaded from the lease page or `GET /api/v1/leases/<id>/
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
as the storefront or the operator publishes it; once per server when a move left a copy of
the disk on another one) to prove who signed it. Without it the command says so on stderr.

A disk whose key was destroyed but whose wipe the record does not prove (the wipe still
pending, or a record from before moves wiped the copy they left) is reported `MISSING`.
Exit status: 0 every proof checks out and every destroyed key has its wipe; 1 a proof does
not check out (forged, changed, another key, a failed result) or the file is no record;
6 (EXIT_NO_WIPE_PROOF) what is there checks out, but a wipe proof is missing."""
import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

FORMAT = "gpu-storefront/sanitization-record/1"
KINDS = ("key_destroyed", "disk_wiped")
EXIT_OK, EXIT_BAD, EXIT_NO_WIPE_PROOF = 0, 1, 6


@dataclass(frozen=True)
class Checked:
    kind: str
    ok: bool
    summary: str
    missing: bool = False       # not a bad proof: one the record should hold is not in it


def verify_record(document: dict, *, node_key: str | Iterable[str] | None = None) -> list[Checked]:
    """One result per proof, then one `missing` result per destroyed key whose disk the
    record does not prove wiped; a record with no proof or the wrong format is one failure.
    `node_key`: the key, or keys, every proof must be signed with."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return [Checked("record", False, f"not a sanitization record (format {FORMAT})")]
    proofs = document.get("proofs")
    if not isinstance(proofs, list) or not proofs:
        return [Checked("record", False, "the record holds no proof")]
    keys = frozenset([node_key] if isinstance(node_key, str) else node_key or ())
    checked = [_check(proof, document.get("lease_id"), keys) for proof in proofs]
    good = [(result.kind, json.loads(proof["signed"])) for proof, result in zip(proofs, checked, strict=True)
            if result.ok]
    return checked + [Checked("disk_wiped", False, _missing_summary(facts), missing=True)
                      for facts in unwiped(good)]


def exit_status(results: list[Checked]) -> int:
    if any(not r.ok and not r.missing for r in results):
        return EXIT_BAD
    return EXIT_NO_WIPE_PROOF if any(r.missing for r in results) else EXIT_OK


def unwiped(proofs: list[tuple[str, dict]]) -> list[dict]:
    """The signed facts of each `key_destroyed` that no `disk_wiped` of the same node for
    the same disk answers ((kind, facts) pairs, in the record's order). The same disk: the
    same LUKS UUID where both name one (one node may have held several copies of a lease
    that moved back and forth), else any wipe of that node not matched yet."""
    keys = [facts for kind, facts in proofs if kind == "key_destroyed"]
    wipes = [facts for kind, facts in proofs if kind == "disk_wiped"]
    unmatched = list(range(len(keys)))
    for exact in (True, False):
        for i in list(unmatched):
            key = keys[i]
            for w, wipe in enumerate(wipes):
                if wipe is None or wipe.get("node") != key.get("node"):
                    continue
                both = key.get("luks_uuid") and wipe.get("luks_uuid")
                if (both and key["luks_uuid"] == wipe["luks_uuid"]) if exact else not both:
                    wipes[w] = None
                    unmatched.remove(i)
                    break
    return [keys[i] for i in unmatched]


def _missing_summary(facts: dict) -> str:
    return (f"node {facts.get('node')}: the key of LUKS {facts.get('luks_uuid') or '-'} "
            f"({facts.get('device') or 'disk'}) was destroyed, but this record holds no proof that the "
            "disk was wiped (the wipe may still be pending: download the record again later)")


def _gpu_memory(facts: dict) -> str:
    """`gpu_memory_cleared` of a release's key proof ({gpu uuid: {"result": ...}}); shown,
    not judged here: a failed clear quarantines the node and fails the card's next burn-in.
    Proofs made before the agent recorded it have none."""
    if "gpu_memory_cleared" not in facts:
        return ""
    cleared = facts["gpu_memory_cleared"]
    if not isinstance(cleared, dict):
        return f", GPU memory cleared: {cleared}"
    if not cleared:
        return ", GPU memory cleared: no GPU"
    return ", GPU memory cleared: " + ", ".join(
        f"{uuid} {'ok' if isinstance(r, dict) and r.get('result') == 'ok' else 'NOT CLEARED'}"
        for uuid, r in sorted(cleared.items()))


def _check(proof, lease_id, node_keys: frozenset[str]) -> Checked:
    kind = proof.get("kind", "?") if isinstance(proof, dict) else "?"
    try:
        key_b64, signed = proof["public_key"], proof["signed"]
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(key_b64, validate=True))
        key.verify(base64.b64decode(proof["signature"], validate=True), signed.encode())
        facts = json.loads(signed)
    except (KeyError, TypeError, ValueError, InvalidSignature) as exc:
        return Checked(kind, False, f"signature does not check out ({type(exc).__name__})")
    if node_keys and key_b64 not in node_keys:
        return Checked(kind, False, "signed by another key than --node-key")
    if not isinstance(facts, dict) or facts.get("kind") != kind or kind not in KINDS or \
            facts.get("lease_id") != lease_id:
        return Checked(kind, False, "the signed facts are not this lease's key destruction/wipe")
    if facts.get("node") != proof.get("node"):
        return Checked(kind, False, "the signed node is not the record's")
    copy = " (the copy a move left there)" if proof.get("disk") == "moved_copy" else ""
    gpu = _gpu_memory(facts)
    if kind == "key_destroyed":
        ok = facts.get("keyslots_after") == 0 and facts.get("test_passphrase_exit") not in (0, None)
        return Checked(kind, ok, f"node {facts['node']}{copy}: LUKS {facts.get('luks_uuid') or '-'} key "
                       f"destroyed at {facts.get('destroyed_at') or facts.get('at')}, keyslots left "
                       f"{facts.get('keyslots_after')}, old key test exit {facts.get('test_passphrase_exit')}{gpu}")
    verification = facts.get("verification") or {}
    ok = facts.get("result") == "ok" and verification.get("nonzero") == 0
    return Checked(kind, ok, f"node {facts['node']}{copy}: {facts.get('device_model')} "
                   f"{facts.get('device_serial')} wiped by {facts.get('method')} "
                   f"({facts.get('nist_category')}), result {facts.get('result')}, "
                   f"{verification.get('samples')} blocks read back, {verification.get('nonzero')} "
                   f"not zero, finished {facts.get('finished_at')}{gpu}")
