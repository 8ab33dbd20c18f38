"""Carvers give each lease its own block device. The operator chooses one: an LVM logical
volume per lease on a volume group of the node's NVMe, or a pool of whole devices
(NVMe namespaces or partitions). The carver also says how much of the drive the device is
(`scope`), which decides the wipe methods that may be used without touching neighbours."""
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nodeagent.interfaces import OperationFailed

from .nvme import SCOPE_DRIVE, SCOPE_NAMESPACE, SCOPE_SHARED
from .runner import Runner

GIB = 1024 ** 3


@dataclass(frozen=True)
class Carve:
    device: str          # the lease's block device
    scope: str           # SCOPE_DRIVE | SCOPE_NAMESPACE | SCOPE_SHARED


class Carver(Protocol):
    def ensure(self, runner: Runner, lease_id: int, size_gb: int) -> Carve: ...
    def find(self, runner: Runner, lease_id: int) -> Carve | None: ...
    def release(self, runner: Runner, lease_id: int) -> None: ...


def lv_name(lease_id: int) -> str:
    return f"gpu-lease-{int(lease_id)}"


@dataclass
class LvmCarver:
    """One logical volume per lease on `volume_group`. LVs share their drive: scope shared."""
    volume_group: str

    def ensure(self, runner: Runner, lease_id: int, size_gb: int) -> Carve:
        found = self.find(runner, lease_id)
        if found:
            return found
        runner.run(["lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y",
                    "--name", lv_name(lease_id), "--size", f"{int(size_gb)}G", self.volume_group])
        return Carve(self._path(lease_id), SCOPE_SHARED)

    def find(self, runner: Runner, lease_id: int) -> Carve | None:
        """The lease's LV, activated: after a boot udev's autoactivation of the volume group
        may not have run yet when the agent starts (or was turned off), and an inactive LV
        has no device node: the disk would look unformatted ("lost its LUKS header")."""
        listed = runner.run(["lvs", "--noheadings", "-o", "lv_name", self.volume_group], check=False)
        names = {line.strip() for line in listed.stdout.splitlines()}
        if lv_name(lease_id) not in names:
            return None
        path = self._path(lease_id)
        if not os.path.exists(path):
            runner.run(["lvchange", "--activate", "y", f"{self.volume_group}/{lv_name(lease_id)}"])
        return Carve(path, SCOPE_SHARED)

    def release(self, runner: Runner, lease_id: int) -> None:
        if self.find(runner, lease_id):
            runner.run(["lvremove", "--yes", f"{self.volume_group}/{lv_name(lease_id)}"])

    def _path(self, lease_id: int) -> str:
        return f"/dev/{self.volume_group}/{lv_name(lease_id)}"


@dataclass
class DevicePoolCarver:
    """Leases get whole devices from `devices` (path -> scope), e.g.
    {"/dev/nvme1n1": "drive", "/dev/nvme2n3": "namespace", "/dev/nvme0n1p4": "shared"}.
    Assignments are kept in `assignments_path` so they survive restarts."""
    devices: dict[str, str]
    assignments_path: Path

    def __post_init__(self):
        for path, scope in self.devices.items():
            if scope not in (SCOPE_DRIVE, SCOPE_NAMESPACE, SCOPE_SHARED):
                raise ValueError(f"{path}: unknown scope {scope!r}")

    def ensure(self, runner: Runner, lease_id: int, size_gb: int) -> Carve:
        found = self.find(runner, lease_id)
        if found:
            return found
        taken = set(self._assignments().values())
        free = [p for p in self.devices if p not in taken]
        sized = [(self._size(runner, p), p) for p in free]
        fitting = sorted((size, p) for size, p in sized if size >= int(size_gb) * GIB)
        if not fitting:
            raise OperationFailed("disk_unavailable", f"no free device of {size_gb} GiB for lease {lease_id}")
        device = fitting[0][1]
        self._save({**self._assignments(), str(int(lease_id)): device})
        return Carve(device, self.devices[device])

    def find(self, runner: Runner, lease_id: int) -> Carve | None:
        device = self._assignments().get(str(int(lease_id)))
        return Carve(device, self.devices.get(device, SCOPE_SHARED)) if device else None

    def release(self, runner: Runner, lease_id: int) -> None:
        assignments = self._assignments()
        if assignments.pop(str(int(lease_id)), None) is not None:
            self._save(assignments)

    @staticmethod
    def _size(runner: Runner, device: str) -> int:
        return int(runner.run(["blockdev", "--getsize64", device]).stdout.strip())

    def _assignments(self) -> dict[str, str]:
        try:
            return json.loads(self.assignments_path.read_text())
        except FileNotFoundError:
            return {}

    def _save(self, assignments: dict[str, str]) -> None:
        self.assignments_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.assignments_path.with_name(self.assignments_path.name + ".tmp")
        tmp.write_text(json.dumps(assignments, indent=1, sort_keys=True))
        os.replace(tmp, self.assignments_path)


NVME_NAMESPACE = re.compile(r"^/dev/(nvme\d+)n\d+$")


def nvme_controller(device: str) -> str | None:
    """/dev/nvme1n2 -> /dev/nvme1 (the controller sanitize and id-ctrl talk to)."""
    match = NVME_NAMESPACE.match(device)
    return f"/dev/{match.group(1)}" if match else None
