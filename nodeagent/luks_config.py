"""Builds the LUKS disk backend (nodeagent.disks, its own package) from the config file's
`[disks]` table, for `disk_backend = "luks"`:

    [disks]
    carver = "lvm"                           # one LV per lease on a volume group, or
    volume_group = "gpu-leases"
    # carver = "devices"                     # a pool of whole devices: path -> scope
    # devices = { "/dev/nvme1n1" = "drive", "/dev/nvme2n1" = "drive" }
    mount_root = "/srv/leases"               # default <state_dir>/mnt
    kek_path = "/etc/gpu-node-agent/disk.kek"  # default <state_dir>/disk.kek (wraps lease keys)
"""
from pathlib import Path

from .config import ConfigError


def open_luks_disks(options: dict, state_dir: Path):
    from .disks import DevicePoolCarver, KeyStore, LuksDisks, LvmCarver, Runner, StateDir

    state_dir = Path(state_dir)
    carver_kind = options.get("carver", "lvm")
    if carver_kind == "lvm":
        if not options.get("volume_group"):
            raise ConfigError("[disks] volume_group is required with carver = \"lvm\"")
        carver = LvmCarver(options["volume_group"])
    elif carver_kind == "devices":
        if not options.get("devices"):
            raise ConfigError("[disks] devices (path -> scope) is required with carver = \"devices\"")
        carver = DevicePoolCarver(dict(options["devices"]), state_dir / "disk-assignments.json")
    else:
        raise ConfigError(f"[disks] carver must be \"lvm\" or \"devices\", not {carver_kind!r}")
    kek = Path(options.get("kek_path") or state_dir / "disk.kek")
    return LuksDisks(carver=carver, keys=KeyStore(state_dir / "disk-keys", kek),
                     state=StateDir(state_dir / "disks"),
                     mount_root=Path(options.get("mount_root") or state_dir / "mnt"),
                     runner=Runner())
