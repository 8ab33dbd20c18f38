"""The node's Ed25519 identity: generated at enrolment, private key 0600 in the state dir,
never sent. Reports are signed over their exact body bytes; evidence records over their
canonical JSON (PROTOCOL.md), so anyone with the public key can check them later."""
import base64
import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .state import write_atomic


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
