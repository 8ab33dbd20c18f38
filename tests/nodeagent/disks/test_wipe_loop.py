"""Wipe on a real loop device: discard (when the backing file supports it, detected and
recorded) plus a zero overwrite, verified by O_DIRECT sampled read-back; a block written
back between wipe and verification makes the record `failed`."""
import os
import subprocess

import pytest

from nodeagent.disks.backend import VERIFY_SAMPLES
from nodeagent.disks.wipe import BLOCK, discard_supported

from . import conftest
from .conftest import DEVICE_MB, make_disks, run
from .loop_device_data import device_is_all_zero, fill_with_data

LEASE = 7


def test_wipe_discards_overwrites_and_verifies(disks, loop_device):
    disks.provision(LEASE, size_gb=0)
    fill_with_data(loop_device)

    evidence = disks.wipe(LEASE)
    record = evidence.details

    assert record["result"] == "ok"
    assert record["method"] == "discard+overwrite" and record["nist_category"] == "purge"
    assert record["luks_uuid"]
    assert record["discard_supported"] == discard_supported(loop_device)
    assert record["device_model"] == "Linux loop device" and record["identity_source"] == "sysfs"
    verification = record["verification"]
    assert verification["samples"] == VERIFY_SAMPLES and verification["nonzero"] == 0
    assert 0 in verification["offsets"] and (DEVICE_MB * 1024 * 1024 - BLOCK) in verification["offsets"]
    assert record["started_at"] <= record["finished_at"]
    ran = [c.argv for c in evidence.commands if c.exit == 0]
    assert ["blkdiscard", "--zeroout", "--force", loop_device] in ran
    assert (["blkdiscard", "--force", loop_device] in ran) == record["discard_supported"]
    # Independent of the sampled check: the whole device reads zeros, no LUKS header left.
    assert device_is_all_zero(loop_device)
    assert run("cryptsetup", "isLuks", loop_device).returncode != 0
    assert disks.carver.find(disks.runner, LEASE) is None        # the device is free again


@pytest.fixture
def no_discard_loop(tmp_path):
    """A loop device whose backing file lives on ramfs, which has no fallocate: the loop
    driver then offers no discard. (Lowering queue/discard_max_bytes instead would stick
    to that loop number until reboot.)"""
    conftest._need_loop_tools()
    mountpoint = tmp_path / "ramfs"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0700", "ramfs", str(mountpoint)], check=True)
    backing = mountpoint / "disk.img"
    with open(backing, "wb") as f:
        f.truncate(DEVICE_MB * 1024 * 1024)
    device = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True,
                            check=True).stdout.strip()
    yield device
    subprocess.run(["losetup", "--detach", device], check=False)
    subprocess.run(["umount", str(mountpoint)], check=False)


def test_without_discard_support_the_wipe_overwrites_only_and_says_so(tmp_path, no_discard_loop):
    loop_device = no_discard_loop
    assert not discard_supported(loop_device)
    disks = make_disks(tmp_path, loop_device)
    disks.provision(LEASE, size_gb=0)
    fill_with_data(loop_device)

    evidence = disks.wipe(LEASE)

    assert evidence.details["discard_supported"] is False and evidence.details["result"] == "ok"
    ran = [c.argv for c in evidence.commands]
    assert ["blkdiscard", "--force", loop_device] not in ran
    assert ["blkdiscard", "--zeroout", "--force", loop_device] in ran
    assert device_is_all_zero(loop_device)


def test_wipe_destroys_the_key_first_and_a_second_call_reports_the_same_record(disks):
    disks.provision(LEASE, size_gb=0)

    first = disks.wipe(LEASE)
    second = disks.wipe(LEASE)

    assert disks.state.load(LEASE).key_destroyed["details"]["keyslots_after"] == 0
    assert second.details == first.details and second.details["result"] == "ok"


def test_data_written_back_before_verification_fails_the_wipe(tmp_path, loop_device):
    def write_back(device):
        fd = os.open(device, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\x5a" * BLOCK, 0)      # the first block is always sampled
            os.fsync(fd)
        finally:
            os.close(fd)

    disks = make_disks(tmp_path, loop_device, before_verify=write_back)
    disks.provision(LEASE, size_gb=0)

    record = disks.wipe(LEASE).details

    assert record["result"] == "failed"
    assert record["verification"]["nonzero"] >= 1 and 0 in record["verification"]["nonzero_offsets"]
    assert disks.state.load(LEASE).wiped is None                  # not recorded as done
    assert disks.carver.find(disks.runner, LEASE) is not None      # the disk is not reused

    disks.before_verify = None                                    # the next attempt passes
    assert disks.wipe(LEASE).details["result"] == "ok"
