"""Runs INSIDE the QEMU guest (see qemu_guest.py): the real disk backend against two
emulated NVMe drives: /dev/nvme0n1 owned whole by one lease (device pool, scope "drive"),
/dev/nvme1n1 a volume group shared by two leases' LVs (scope "shared"). Prints one
`GUEST-RESULT <json>` line per step on the serial console for the test to parse."""
import json
import os
import subprocess
import traceback
from pathlib import Path

from nodeagent.disks import DevicePoolCarver, KeyStore, LuksDisks, LvmCarver, Runner, StateDir, wipe
from nodeagent.interfaces import OperationFailed

DEVICE, LEASE = "/dev/nvme0n1", 7
VG, LVM_DRIVE, LV_LEASE, NEIGHBOUR = "gpu-leases", "/dev/nvme1n1", 8, 9
SECRET = "customer fine-tuning checkpoint\n"


def emit(step: str, **result) -> None:
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    print("GUEST-RESULT " + json.dumps({"step": step, "uptime_s": uptime, **result}, sort_keys=True), flush=True)


def backend() -> LuksDisks:
    """A fresh backend over the same state dir: what the agent is after a restart."""
    return LuksDisks(carver=DevicePoolCarver({DEVICE: "drive"}, Path("/state/assignments.json")),
                     keys=KeyStore(Path("/state/disk-keys"), Path("/run/kek/node-disk.kek")),
                     state=StateDir(Path("/state/disks")), mount_root=Path("/srv/leases"),
                     runner=Runner())


def lvm_backend() -> LuksDisks:
    return LuksDisks(carver=LvmCarver(VG), keys=KeyStore(Path("/state/lvm-keys"), Path("/run/kek/node-disk.kek")),
                     state=StateDir(Path("/state/lvm-disks")), mount_root=Path("/srv/leases"), runner=Runner())


def mounted(path: str) -> str:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == path:
            return f"{fields[0]} {fields[2]} {fields[3]}"
    return ""


def main() -> None:
    id_ctrl = subprocess.run(["nvme", "id-ctrl", "/dev/nvme0", "-o", "json"], capture_output=True, text=True)
    emit("id-ctrl", exit=id_ctrl.returncode, json=json.loads(id_ctrl.stdout or "{}"),
         io_timeout=Path("/sys/module/nvme_core/parameters/io_timeout").read_text().strip())

    disks = backend()
    path = disks.ensure_ready(LEASE, size_gb=0)
    Path(path, "checkpoint.txt").write_text(SECRET)
    os.sync()
    emit("ready", path=path, mount=mounted(path), mapper=os.path.exists("/dev/mapper/gpu-lease-7"),
         luks_type=subprocess.run(["blkid", "-p", "-o", "value", "-s", "TYPE", DEVICE],
                                  capture_output=True, text=True).stdout.strip())

    disks.detach(LEASE)                                          # like a reboot: closed
    emit("detached", mount=mounted(path), mapper=os.path.exists("/dev/mapper/gpu-lease-7"))
    again = backend().ensure_ready(LEASE, size_gb=0)             # reopened from the wrapped key
    emit("reopened", path=again, data=Path(again, "checkpoint.txt").read_text() == SECRET,
         ran=[c.argv[:2] for c in disks.runner.commands])

    restarted = backend()
    old_key = bytes(restarted.keys.load(LEASE))
    proof = restarted.destroy_key(LEASE)
    reopen = subprocess.run(["cryptsetup", "open", "--key-file", "-", DEVICE, "stolen"],
                            input=old_key, capture_output=True)
    emit("key_destroyed", details=proof.details,
         commands=[{"argv": c.argv, "exit": c.exit} for c in proof.commands],
         mount=mounted(path), mapper=os.path.exists("/dev/mapper/gpu-lease-7"),
         reopen_exit=reopen.returncode, again=backend().destroy_key(LEASE).details == proof.details)

    record = backend().wipe(LEASE)
    with open(DEVICE, "rb") as f:
        head = f.read(16 * 1024 * 1024)
    emit("wiped", details=record.details, commands=[{"argv": c.argv, "exit": c.exit} for c in record.commands],
         head_zero=head == bytes(len(head)), again=backend().wipe(LEASE).details == record.details)



def lvm_main() -> None:
    for argv in (["pvcreate", "-y", LVM_DRIVE], ["vgcreate", VG, LVM_DRIVE]):    # operator setup
        subprocess.run(argv, check=True, capture_output=True)
    disks = lvm_backend()
    mine, theirs = disks.ensure_ready(LV_LEASE, size_gb=1), disks.ensure_ready(NEIGHBOUR, size_gb=1)
    Path(mine, "checkpoint.txt").write_text(SECRET)
    Path(theirs, "neighbour.txt").write_text("the other tenant\n")
    os.sync()
    emit("lvm_ready", mine=mounted(mine), theirs=mounted(theirs))
    record = disks.wipe(LV_LEASE)
    emit("lvm_wiped", details=record.details,
         commands=[{"argv": c.argv, "exit": c.exit} for c in record.commands],
         lv_removed=not os.path.exists(f"/dev/{VG}/gpu-lease-{LV_LEASE}"),
         neighbour_mounted=bool(mounted(theirs)),
         neighbour_data=Path(theirs, "neighbour.txt").read_text() == "the other tenant\n")

def unreadable_main() -> None:
    """A block that returns EIO on read-back: device-mapper's error target over the last
    4 KiB of a device whose first MiB is the (wiped, zero) whole drive."""
    table = f"0 2040 linear {DEVICE} 0\n2040 8 error\n"
    subprocess.run(["dmsetup", "create", "flaky"], input=table, text=True, check=True, capture_output=True)
    emit("unreadable", verification=wipe.verify_zero("/dev/mapper/flaky", 16))
    subprocess.run(["dmsetup", "remove", "flaky"], check=True, capture_output=True)


if __name__ == "__main__":
    try:
        main()
        lvm_main()
        unreadable_main()
    except (OperationFailed, Exception) as exc:                 # report, then power off
        kernel_log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
        emit("error", error=repr(exc), trace=traceback.format_exc() + "\nguest dmesg:\n" + kernel_log[-4000:])
