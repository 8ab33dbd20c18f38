"""Where a lease's LUKS key lives while the lease lives (see docs/DISKS.md).

The key is 64 bytes from os.urandom. It reaches cryptsetup only through a pipe. So that
a node reboot does not lose the customer's data, it is kept *wrapped* (AES-256-GCM) by a
per-node key-encryption key (KEK): the wrapped blob in the agent's state dir, the KEK in
a root-only file whose path the operator chooses (ideally another medium than the state
dir, e.g. a TPM-sealed credential unpacked to /run at boot). The raw key is never
written anywhere; only the agent process holds it, briefly, while a command runs."""
import os
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from nodeagent.interfaces import OperationFailed

KEY_BYTES = 64      # a 512-bit passphrase: full entropy, so no key stretching is needed
KEK_BYTES = 32
NONCE_BYTES = 12


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` (mode 0600) atomically and durably."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class KeyStore:
    def __init__(self, wrapped_dir: Path, kek_path: Path):
        self.wrapped_dir, self.kek_path = Path(wrapped_dir), Path(kek_path)

    def new_key(self, lease_id: int) -> bytearray:
        """A fresh random key for the lease, stored wrapped before it is ever used."""
        key = bytearray(os.urandom(KEY_BYTES))
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self._kek()).encrypt(nonce, bytes(key), self._aad(lease_id))
        _write_private(self._path(lease_id), nonce + sealed)
        return key

    def load(self, lease_id: int) -> bytearray:
        try:
            blob = self._path(lease_id).read_bytes()
        except FileNotFoundError:
            raise OperationFailed("disk_key_missing", f"no stored key for lease {lease_id}") from None
        kek = self._kek()
        try:
            raw = AESGCM(kek).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], self._aad(lease_id))
        except Exception:
            raise OperationFailed("disk_key_unreadable",
                                  f"the stored key of lease {lease_id} does not unwrap with this node's KEK") from None
        return bytearray(raw)

    def has_key(self, lease_id: int) -> bool:
        return self._path(lease_id).exists()

    def shred(self, lease_id: int) -> None:
        """Overwrite the wrapped copy with random bytes, then unlink it. Idempotent."""
        path = self._path(lease_id)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, os.urandom(size))
            os.fsync(fd)
        finally:
            os.close(fd)
        path.unlink()
        _fsync_dir(path.parent)

    def _kek(self) -> bytes:
        try:
            kek = self.kek_path.read_bytes()
        except FileNotFoundError:
            if any(self.wrapped_dir.glob("*.wrapped")):   # a KEK that failed to load: never replace it
                raise OperationFailed("disk_kek_missing", f"{self.kek_path} is missing but leases' "
                                      "keys are wrapped with it") from None
            kek = os.urandom(KEK_BYTES)
            _write_private(self.kek_path, kek)
        if len(kek) != KEK_BYTES:
            raise OperationFailed("disk_kek_invalid", f"{self.kek_path} is not a {KEK_BYTES}-byte key")
        return kek

    def _path(self, lease_id: int) -> Path:
        return self.wrapped_dir / f"lease-{int(lease_id)}.key.wrapped"

    @staticmethod
    def _aad(lease_id: int) -> bytes:
        return f"gpu-node-agent lease disk key v1 lease={int(lease_id)}".encode()


def forget(key: bytearray) -> None:
    """Zero the in-memory copy (best effort: Python may have made transient copies)."""
    for i in range(len(key)):
        key[i] = 0
