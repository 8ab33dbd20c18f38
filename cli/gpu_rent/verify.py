"""`gpu-rent verify-record FILE --node-key-fingerprint SHA256:…`: check a lease's
sanitization record offline, without trusting the storefront that served it.

The record (lease page, or `GET /api/v1/leases/<id>/sanitization-record`) holds each proof as
the node signed it: `signed` (the exact canonical JSON the Ed25519 signature covers),
`signature` and the node's `public_key` (raw, base64). A key inside the file proves only that
the proof is intact; who signed it is proven by comparing that key with the node key
fingerprint the customer was given when the lease started (lease page, `instance.ready`
webhook, API `node_keys`), before any record existed. This module is the CLI's own: it imports
nothing of the node agent or the storefront (docs/adr/0013-burn-in-by-card-class.md).

Fingerprint: "SHA256:" + unpadded base64 of SHA-256 over the raw 32-byte public key.
Exit status: 0 every proof checks out, is signed by a given key and every destroyed key has
its wipe; 1 a proof does not check out or the file is no record; 20 what is there checks out
but a wipe proof is missing; 21 every proof checks out but no fingerprint was given, so who
signed them is not proven (the CLI's other codes are its API's, errors.py)."""
import base64
import hashlib
import json
from dataclasses import dataclass

FORMAT = "gpu-storefront/sanitization-record/1"
KINDS = ("key_destroyed", "disk_wiped")
EXIT_OK, EXIT_BAD, EXIT_NO_WIPE_PROOF, EXIT_SIGNER_UNPROVEN = 0, 1, 20, 21


def fingerprint(public_key_b64: str) -> str:
    raw = base64.b64decode(public_key_b64, validate=True)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def _normal(value: str) -> str:
    value = value.strip()
    return value if value.startswith("SHA256:") else fingerprint(value)   # a whole key given


@dataclass(frozen=True)
class Checked:
    kind: str
    ok: bool
    summary: str
    missing: bool = False


def _verify_signature(public_key_b64: str, signature_b64: str, message: bytes) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64, validate=True))
    key.verify(base64.b64decode(signature_b64, validate=True), message)


def _check(proof, lease_id, fingerprints: frozenset[str]) -> tuple[Checked, dict | None]:
    from cryptography.exceptions import InvalidSignature

    kind = proof.get("kind", "?") if isinstance(proof, dict) else "?"
    try:
        _verify_signature(proof["public_key"], proof["signature"], proof["signed"].encode())
        facts = json.loads(proof["signed"])
        print_key = fingerprint(proof["public_key"])
    except (KeyError, TypeError, ValueError, AttributeError, InvalidSignature) as exc:
        return Checked(kind, False, f"signature does not check out ({type(exc).__name__})"), None
    if fingerprints and print_key not in fingerprints:
        return Checked(kind, False, f"signed by key {print_key}, not one you were given"), None
    if not isinstance(facts, dict) or facts.get("kind") != kind or kind not in KINDS or \
            facts.get("lease_id") != lease_id or facts.get("node") != proof.get("node"):
        return Checked(kind, False, "the signed facts are not this lease's key destruction or wipe"), None
    where = f"node {facts['node']} (key {print_key})"
    if kind == "key_destroyed":
        ok = facts.get("keyslots_after") == 0 and facts.get("test_passphrase_exit") not in (0, None)
        return Checked(kind, ok, f"{where}: LUKS {facts.get('luks_uuid') or '-'} key destroyed at "
                       f"{facts.get('destroyed_at') or facts.get('at')}, keyslots left "
                       f"{facts.get('keyslots_after')}"), facts
    verification = facts.get("verification") or {}
    ok = facts.get("result") == "ok" and verification.get("nonzero") == 0
    confidence = verification.get("confidence") or {}
    stated = (f"; {confidence.get('statement')}" if confidence.get("statement") else
              "; the record states no confidence for its sample")
    return Checked(kind, ok, f"{where}: {facts.get('device_model')} {facts.get('device_serial')} wiped by "
                   f"{facts.get('method')}, result {facts.get('result')}, {verification.get('samples')} "
                   f"blocks read back, {verification.get('nonzero')} not zero{stated}"), facts


def _unwiped(good: list[tuple[str, dict]]) -> list[dict]:
    """Each key destruction no wipe of the same node (same LUKS UUID where both name one)
    answers."""
    keys = [f for k, f in good if k == "key_destroyed"]
    wipes: list[dict | None] = [f for k, f in good if k == "disk_wiped"]
    left = list(range(len(keys)))
    for exact in (True, False):
        for i in list(left):
            for w, wipe in enumerate(wipes):
                if wipe is None or wipe.get("node") != keys[i].get("node"):
                    continue
                both = keys[i].get("luks_uuid") and wipe.get("luks_uuid")
                if (both and keys[i]["luks_uuid"] == wipe["luks_uuid"]) if exact else not both:
                    wipes[w] = None
                    left.remove(i)
                    break
    return [keys[i] for i in left]


def verify(document, fingerprints=()) -> list[Checked]:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return [Checked("record", False, f"not a sanitization record (format {FORMAT})")]
    proofs = document.get("proofs")
    if not isinstance(proofs, list) or not proofs:
        return [Checked("record", False, "the record holds no proof")]
    given = frozenset(_normal(f) for f in fingerprints)
    results = [_check(p, document.get("lease_id"), given) for p in proofs]
    good = [(c.kind, facts) for c, facts in results if c.ok and facts is not None]
    return [c for c, _ in results] + [
        Checked("disk_wiped", False, f"node {f.get('node')}: the key of LUKS {f.get('luks_uuid') or '-'} was "
                "destroyed, but this record holds no proof that the disk was wiped", missing=True)
        for f in _unwiped(good)]


def exit_status(results: list[Checked], *, fingerprints_given: bool) -> int:
    if any(not r.ok and not r.missing for r in results):
        return EXIT_BAD
    if any(r.missing for r in results):
        return EXIT_NO_WIPE_PROOF
    return EXIT_OK if fingerprints_given else EXIT_SIGNER_UNPROVEN


def report(results: list[Checked], *, fingerprints_given: bool) -> list[str]:
    """What was and was not proven, in plain lines."""
    lines = [f"{'MISSING' if r.missing else 'ok' if r.ok else 'FAILED'}  {r.kind}: {r.summary}" for r in results]
    proven = [r for r in results if r.ok]
    lines.append("")
    lines.append("Proven: " + ("each proof marked ok is intact (its signature checks out)" if proven else "nothing"))
    if fingerprints_given:
        lines.append("Proven: those proofs were signed by a node key whose fingerprint you gave")
    else:
        lines.append("NOT proven: who signed them. Give --node-key-fingerprint with the fingerprint you were "
                     "given when the lease started; a key inside the record only proves it is intact")
    if any(r.missing for r in results):
        lines.append("NOT proven: that every disk whose key was destroyed was wiped (download the record "
                     "again later: the wipe may still be pending)")
    lines.append("Not covered by any record: what the node did beyond what it signed (its own honesty "
                 "about the facts it signed) and data outside the lease disk (see the record's `covers`)")
    return lines


def add_parser(add) -> None:
    p = add("verify-record", "check a sanitization record offline against the node key you were given")
    p.add_argument("file", help="the record (JSON) downloaded from the lease page or the API")
    p.add_argument("--node-key-fingerprint", action="append", default=[], metavar="SHA256:…",
                   help="the node key fingerprint given at lease start (again for each server); "
                        "a whole base64 key is accepted too")


def run(args) -> int:
    from .errors import CliError
    from .output import emit_json

    try:
        with open(args.file, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, ValueError) as exc:
        raise CliError(EXIT_BAD, f"cannot read {args.file}: {exc}") from None
    try:
        results = verify(document, args.node_key_fingerprint)
    except ValueError as exc:          # a fingerprint argument that is no key
        raise CliError(EXIT_BAD, f"--node-key-fingerprint: {exc}") from None
    given = bool(args.node_key_fingerprint)
    status = exit_status(results, fingerprints_given=given)
    if getattr(args, "json", False):
        emit_json({"status": status, "signer_proven": given and status in (EXIT_OK, EXIT_NO_WIPE_PROOF),
                   "proofs": [r.__dict__ for r in results]})
    else:
        print("\n".join(report(results, fingerprints_given=given)))
    return status
