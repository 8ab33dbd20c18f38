"""Per-lease disk state on the node (device, LUKS UUID, the proofs already made), so
every step can be repeated safely after a crash or a restart."""
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from nodeagent.interfaces import CommandRecord, DiskEvidence


@dataclass
class LeaseDisk:
    lease_id: int
    device: str = ""
    scope: str = ""
    luks_uuid: str = ""
    filesystem_made: bool = False
    key_destroyed: dict | None = None      # the stored proof (details + commands)
    wiped: dict | None = None              # the stored sanitization record of a wipe that passed


def evidence_to_dict(evidence: DiskEvidence) -> dict:
    return {"details": evidence.details, "commands": [asdict(c) for c in evidence.commands]}


def evidence_from_dict(stored: dict) -> DiskEvidence:
    return DiskEvidence(details=dict(stored["details"]),
                        commands=[CommandRecord(**c) for c in stored["commands"]])


@dataclass
class StateDir:
    path: Path

    def load(self, lease_id: int) -> LeaseDisk | None:
        try:
            return LeaseDisk(**json.loads(self._file(lease_id).read_text()))
        except FileNotFoundError:
            return None

    def save(self, disk: LeaseDisk) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = self._file(disk.lease_id)
        tmp = target.with_name(target.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(disk), f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)

    def _file(self, lease_id: int) -> Path:
        return self.path / f"lease-{int(lease_id)}.json"
