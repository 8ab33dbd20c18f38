"""Secrets the storefront must keep to use later (a snapshot's restic password and S3
secret), sealed at rest with a key derived from SECRET_KEY (Fernet: AES-128-CBC + HMAC):
a copy of the database alone does not open the customers' snapshots."""
import base64
import hashlib
import json

from cryptography.fernet import Fernet
from django.conf import settings

PURPOSE = b"gpu-storefront/sealed-secrets/1"


def _box() -> Fernet:
    key = hashlib.sha256(PURPOSE + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def seal(values: dict[str, str]) -> str:
    return _box().encrypt(json.dumps(values, sort_keys=True).encode()).decode()


def unseal(token: str) -> dict[str, str]:
    return json.loads(_box().decrypt(token.encode()))
