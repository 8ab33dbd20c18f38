"""The `directory` disk backend — for development and tests ONLY: each lease's disk is a
plain directory under `[disks] root`, NOT encrypted and with no size limit. Its key
destruction has no key to destroy and says so in the signed evidence (method
"none: unencrypted directory backend"); production nodes use the LUKS backend
(nodeagent.disks)."""
import subprocess
from pathlib import Path

from .interfaces import CommandRecord, DiskEvidence, OperationFailed

METHOD = "none: unencrypted directory backend"


class DirectoryDisks:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def ensure_ready(self, lease_id: int, size_gb: int) -> str:
        path = self._path(lease_id)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OperationFailed("disk_error", f"{path}: {exc}") from exc
        return str(path)

    def is_ready(self, lease_id: int) -> bool:
        return self._path(lease_id).is_dir()

    def mount_path(self, lease_id: int) -> str:
        return str(self._path(lease_id))

    def detach(self, lease_id: int) -> None:
        """Nothing is mounted or opened, so there is nothing to close."""

    def destroy_key(self, lease_id: int) -> DiskEvidence:
        return DiskEvidence(details={"device": str(self._path(lease_id)), "luks_uuid": "",
                                     "method": METHOD, "keyslots_after": 0,
                                     "test_passphrase_exit": None})

    def wipe(self, lease_id: int) -> DiskEvidence:
        path = self._path(lease_id)
        argv = ["rm", "-rf", "--one-file-system", str(path)]
        run = subprocess.run(argv, capture_output=True, text=True)
        if run.returncode != 0 or path.exists():
            raise OperationFailed("disk_error", f"{' '.join(argv)}: {run.stderr.strip()}")
        return DiskEvidence(
            details={"device_model": "directory", "device_serial": "", "firmware": "",
                     "method": METHOD, "nist_category": "none", "result": "ok",
                     "verification": {"samples": 0, "nonzero": 0, "pattern": "none"}},
            commands=[CommandRecord(argv=argv, exit=run.returncode)])

    def _path(self, lease_id: int) -> Path:
        return self.root / f"lease-{int(lease_id)}"


def open_directory_disks(options: dict, state_dir: Path) -> DirectoryDisks:
    return DirectoryDisks(options.get("root") or state_dir / "disks")
