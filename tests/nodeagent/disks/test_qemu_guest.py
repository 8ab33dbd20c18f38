"""The dm-crypt path and `nvme format --ses=1` for real, in a QEMU guest (TCG, no KVM)
with an emulated NVMe drive: the backend formats LUKS2, opens, mkfs, mounts, survives a
close/reopen with the wrapped key, destroys the key (the old key no longer opens the
volume) and wipes with the method the drive's id-ctrl allows, verified by read-back.
See qemu_guest.py for the kernel/initramfs it builds (cached)."""
import json

import pytest

from nodeagent.disks.backend import VERIFY_SAMPLES
from tests.tools import require, require_tool

from . import qemu_guest

DRIVE_MB, LVM_DRIVE_MB = 256, 2600


def results(serial: str) -> dict[str, dict]:
    found = {}
    for line in serial.splitlines():
        if line.startswith("GUEST-RESULT "):
            record = json.loads(line[len("GUEST-RESULT "):])
            found[record.pop("step")] = record
    return found


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    require_tool("qemu-system-x86_64", "apt install qemu-system-x86 (scripts/install-disk-tools.sh)")
    require_tool("busybox", "apt install busybox-static")
    for tool in ("cryptsetup", "nvme", "mke2fs", "dpkg-deb", "apt-cache", "ldd"):
        require_tool(tool, "scripts/install-disk-tools.sh")
    work = tmp_path_factory.mktemp("guest")
    drives = [work / "nvme-whole.img", work / "nvme-lvm.img"]
    for drive, size_mb in zip(drives, (DRIVE_MB, LVM_DRIVE_MB), strict=True):
        with open(drive, "wb") as f:
            f.truncate(size_mb * 1024 * 1024)
    try:
        serial, seconds = qemu_guest.boot(work, drives)
    except qemu_guest.GuestUnavailable as missing:
        require(False, str(missing))
    steps = results(serial)
    require("GUEST-BOOTED" in serial, f"the guest did not boot:\n{serial[-3000:]}")
    assert "error" not in steps, steps.get("error", {}).get("trace")
    assert "GUEST-INSMOD-FAILED" not in serial, serial
    print(f"QEMU guest run: {seconds:.1f}s")
    return steps


def test_luks2_open_mkfs_mount_and_reopen_after_close(guest):
    ready = guest["ready"]
    assert ready["luks_type"] == "crypto_LUKS" and ready["mapper"]
    assert ready["mount"].startswith("/dev/mapper/gpu-lease-7 ext4 ") and "nosuid,nodev" in ready["mount"]
    assert (guest["detached"]["mapper"], guest["detached"]["mount"]) == (False, "")
    assert guest["reopened"]["data"] is True                   # the data survived the close


def test_key_destroyed_in_the_guest_and_the_old_key_opens_nothing(guest):
    destroyed = guest["key_destroyed"]
    assert destroyed["details"]["keyslots_after"] == 0 and destroyed["details"]["test_passphrase_exit"] != 0
    assert destroyed["reopen_exit"] != 0 and not destroyed["mapper"] and destroyed["mount"] == ""
    argv = [c["argv"][:2] for c in destroyed["commands"]]
    assert argv[:3] == [["umount", "/srv/leases/gpu-lease-7"], ["cryptsetup", "close"], ["cryptsetup", "luksErase"]]
    assert destroyed["again"] is True


def test_nvme_format_ses1_wipe_verified_in_the_guest(guest):
    wiped = guest["wiped"]
    record = wiped["details"]
    caps = guest["id-ctrl"]["json"]
    assert caps["mn"].strip() == "QEMU NVMe Ctrl" and caps["sanicap"] == 0 and caps["fna"] == 0
    assert guest["id-ctrl"]["io_timeout"] == "600"       # TCG on a loaded host is slow, not broken
    assert record["method"] == "format-ses1" and record["result"] == "ok"
    assert (record["device_model"], record["device_serial"]) == ("QEMU NVMe Ctrl", "GPUSTORE0001")
    assert {"argv": ["nvme", "format", "/dev/nvme0n1", "--ses=1", "--force"], "exit": 0} in wiped["commands"]
    assert not any("--ses=0" in c["argv"] for c in wiped["commands"])
    assert record["verification"]["samples"] == VERIFY_SAMPLES and record["verification"]["nonzero"] == 0
    assert wiped["head_zero"] is True and wiped["again"] is True


def test_lvm_carved_lease_is_wiped_without_touching_its_neighbour(guest):
    assert guest["lvm_ready"]["mine"].startswith("/dev/mapper/gpu-lease-8 ext4")
    wiped = guest["lvm_wiped"]
    record = wiped["details"]
    lv = "/dev/gpu-leases/gpu-lease-8"
    assert record["scope"] == "shared" and record["method"] == "discard+overwrite"
    assert record["result"] == "ok" and record["nist_category"] == "purge"
    assert (record["device_model"], record["device_serial"]) == ("QEMU NVMe Ctrl", "GPUSTORE0002")
    assert "capabilities" not in record            # an LV never gets drive-wide commands
    argv = [c["argv"] for c in wiped["commands"]]
    assert record["discard_supported"] is True           # QEMU's NVMe deallocates (DSM)
    assert ["blkdiscard", "--force", lv] in argv and ["blkdiscard", "--zeroout", "--force", lv] in argv
    assert not any(a[0] == "nvme" and a[1] in ("format", "sanitize") for a in argv)
    assert record["verification"]["nonzero"] == 0 and record["verification"]["samples"] == VERIFY_SAMPLES
    assert wiped["lv_removed"] and wiped["neighbour_mounted"] and wiped["neighbour_data"]


def test_an_unreadable_block_fails_the_verification_with_its_error(guest):
    verification = guest["unreadable"]["verification"]
    last_block = 1024 * 1024 - 4096
    assert last_block in verification["nonzero_offsets"] and verification["nonzero"] == 1
    assert verification["unreadable_offsets"] == {str(last_block): "Input/output error"}
    assert 0 in verification["offsets"]                  # readable zero blocks still pass
