"""A loop device's contents: customer data written after the LUKS header, and the check that a
wipe left nothing but zeros."""
import os

from .conftest import DEVICE_MB


def fill_with_data(device: str) -> None:
    """Customer data everywhere after the LUKS header (what a lease leaves behind)."""
    with open(device, "r+b") as f:
        f.seek(16 * 1024 * 1024)
        chunk = os.urandom(1024 * 1024)
        for _ in range(DEVICE_MB - 16):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def device_is_all_zero(device: str) -> bool:
    zero = bytes(1024 * 1024)
    with open(device, "rb") as f:
        return all(f.read(len(zero)) == zero for _ in range(DEVICE_MB))
