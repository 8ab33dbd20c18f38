"""Real block devices for the disk backend: sparse files on loop devices (the CI kernel
has loop but no device-mapper and no NVMe driver; that part runs in the QEMU guest)."""
import os
import subprocess

import pytest

from nodeagent.disks import DevicePoolCarver, KeyStore, LuksDisks, Runner, StateDir
from tests.tools import require, require_tool

DEVICE_MB = 64


def _need_loop_tools():
    require(os.geteuid() == 0, "loop devices and cryptsetup need root")
    for tool in ("losetup", "cryptsetup", "blkdiscard", "lsblk", "blockdev"):
        require_tool(tool)


@pytest.fixture
def loop_device(tmp_path):
    """A fresh 64 MiB loop device, detached afterwards."""
    _need_loop_tools()
    backing = tmp_path / "disk.img"
    with open(backing, "wb") as f:
        f.truncate(DEVICE_MB * 1024 * 1024)
    attach = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    require(attach.returncode == 0, f"no free loop device: {attach.stderr.strip()}")
    device = attach.stdout.strip()
    yield device
    subprocess.run(["blockdev", "--setrw", device], check=False)
    subprocess.run(["losetup", "--detach", device], check=False)


def make_disks(tmp_path, device, **options) -> LuksDisks:
    state = tmp_path / "state"
    return LuksDisks(carver=DevicePoolCarver({device: "shared"}, state / "disk-assignments.json"),
                     keys=KeyStore(state / "disk-keys", tmp_path / "kek" / "node-disk.kek"),
                     state=StateDir(state / "disks"), mount_root=tmp_path / "mnt",
                     runner=Runner(), **options)


@pytest.fixture
def disks(tmp_path, loop_device) -> LuksDisks:
    return make_disks(tmp_path, loop_device)


def run(*argv, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """Independent checks in the tests: straight subprocess, not the backend's runner."""
    return subprocess.run(list(argv), input=stdin, capture_output=True)
