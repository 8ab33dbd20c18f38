"""The node's Ed25519 identity: generated at enrolment, private key 0600 in the state dir,
never sent. Reports are signed over their exact body bytes; evidence records over their
canonical JSON (PROTOCOL.md), so anyone with the public key can check them later."""
import base64
import hashlib
import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .state import write_atomic


def fingerprint(public_key_b64: str) -> str:
    """The key's fingerprint as customers are given it at lease start and pass to
    `gpu-rent verify-record`: "SHA256:" and the unpadded base64 of SHA-256 over the raw
    32-byte public key (an SSH key fingerprint's form). The CLI computes the same on its own
    (cli/gpu_rent/verify.py)."""
    raw = base64.b64decode(public_key_b64, validate=True)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def canonical_json(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class NodeKey:
    def __init__(self, private_key: Ed25519PrivateKey):
        self._key = private_key

    @classmethod
    def generate(cls, path: Path) -> "NodeKey":
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        write_atomic(path, pem, mode=0o600)
        return cls(key)

    @classmethod
    def load(cls, path: Path) -> "NodeKey":
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} is not an Ed25519 private key")
        return cls(key)

    def public_key_b64(self) -> str:
        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw,
                                                  serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self._key.sign(data)).decode()

    def sign_record(self, record: dict) -> dict:
        """The record with its `signature` over the canonical JSON of everything else."""
        unsigned = {k: v for k, v in record.items() if k != "signature"}
        return {**unsigned, "signature": self.sign(canonical_json(unsigned))}
