"""Builds the disk backend from the `[disks]` table of /etc/gpu-node-agent/config.toml:

    [disks]
    carver = "lvm"                        # or "devices"
    volume_group = "gpu-leases"           # carver = "lvm": one LV per lease
    # carver = "devices": whole devices per lease and how much of their drive each is
    # devices = { "/dev/nvme1n1" = "drive", "/dev/nvme2n1" = "namespace", "/dev/nvme0n1p4" = "shared" }
    mount_root = "/srv/gpu-leases"        # default <state_dir>/mnt
    kek_path = "/run/credentials/gpu-node-agent.service/disk-kek"   # default <state_dir>/disk.kek; see docs/DISKS.md
    verify_samples = 3000                 # 95 % confidence of a 0.1 % residue (wipe.sample_confidence)
"""
from collections.abc import Mapping
from pathlib import Path

from .backend import VERIFY_SAMPLES, LuksDisks
from .carvers import Carver, DevicePoolCarver, LvmCarver
from .keystore import KeyStore
from .runner import Runner
from .state import StateDir


def disks_from_config(section: Mapping, *, state_dir: Path) -> LuksDisks:
    state_dir = Path(state_dir)
    return LuksDisks(carver=_carver(section, state_dir),
                     keys=KeyStore(state_dir / "disk-keys", Path(section.get("kek_path") or state_dir / "disk.kek")),
                     state=StateDir(state_dir / "disks"),
                     mount_root=Path(section.get("mount_root") or state_dir / "mnt"),
                     runner=Runner(), verify_samples=int(section.get("verify_samples", VERIFY_SAMPLES)))


def _carver(section: Mapping, state_dir: Path) -> Carver:
    kind = section.get("carver")
    if kind == "lvm":
        if not section.get("volume_group"):
            raise ValueError("[disks] carver = \"lvm\" needs volume_group")
        return LvmCarver(str(section["volume_group"]))
    if kind == "devices":
        devices = dict(section.get("devices") or {})
        if not devices:
            raise ValueError("[disks] carver = \"devices\" needs a devices table")
        return DevicePoolCarver(devices, state_dir / "disk-assignments.json")
    raise ValueError(f"[disks] carver must be \"lvm\" or \"devices\", not {kind!r}")
