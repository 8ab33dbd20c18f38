"""Hashing of node credentials and enrolment codes, and Ed25519 checks of what nodes sign
(PROTOCOL.md, "Trust"): the raw body of every report, and each evidence record on its own
over its canonical JSON. The storefront signs nothing here; it only verifies."""
import base64
import binascii
import hashlib
import json
import secrets

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    """256 random bits in hex: typed after `--code` on a shell, so never starting with "-"
    (a urlsafe token sometimes does, and argparse then takes it for an option)."""
    return secrets.token_hex(32)


def canonical_json(record: dict) -> bytes:
    """The bytes an evidence record is signed over: without `signature`, keys sorted."""
    unsigned = {k: v for k, v in record.items() if k != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _b64(value: str) -> bytes | None:
    if not isinstance(value, str) or len(value) > 200:
        return None
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def public_key_valid(value: str) -> bool:
    raw = _b64(value)
    if raw is None or len(raw) != 32:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return False
    return True


def signature_valid(*, public_key: str, signature: str, message: bytes) -> bool:
    raw_key, raw_sig = _b64(public_key), _b64(signature)
    if raw_key is None or raw_sig is None or len(raw_key) != 32 or len(raw_sig) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(raw_key).verify(raw_sig, message)
    except (InvalidSignature, ValueError):
        return False
    return True
