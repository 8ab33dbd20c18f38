"""Lease disks of a fixed size for the tests on this machine: each an ext4 file system
on its own loop device, mounted where dockerd sees it. The CI kernel has no
device-mapper, so no LUKS here (the `luks` backend runs in the node in a box); what these
give the host-side tests is what the `directory` backend cannot: a real size, so a tenant
filling its writable layer fills its own disk only, and a backing file that is "the lease's
disk" the tenant-bytes scans leave out, everything else being searched."""
import subprocess
from pathlib import Path

from nodeagent.interfaces import DiskEvidence


class LoopDisks:
    def __init__(self, root: Path, size_mb: int):
        self.root, self.size_mb = Path(root), size_mb
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)

    def image(self, lease_id: int) -> Path:
        return self.root / f"lease-{lease_id}.ext4"

    def mountpoint(self, lease_id: int) -> Path:
        return self.root / f"lease-{lease_id}"

    def ensure_ready(self, lease_id: int, size_gb: int) -> str:
        image, mountpoint = self.image(lease_id), self.mountpoint(lease_id)
        if not image.exists():
            with open(image, "wb") as sparse:
                sparse.truncate(self.size_mb * 1024 ** 2)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", str(image)], check=True,
                           capture_output=True)
        mountpoint.mkdir(mode=0o700, exist_ok=True)
        if not mountpoint.is_mount():
            subprocess.run(["mount", "-o", "loop,nodev,nosuid", str(image), str(mountpoint)],
                           check=True, capture_output=True)
        return str(mountpoint)

    def is_ready(self, lease_id: int) -> bool:
        return self.mountpoint(lease_id).is_mount()

    def mount_path(self, lease_id: int) -> str:
        return str(self.mountpoint(lease_id))

    def detach(self, lease_id: int) -> None:
        if self.mountpoint(lease_id).is_mount():
            subprocess.run(["umount", str(self.mountpoint(lease_id))], check=True, capture_output=True)

    def destroy(self, lease_id: int) -> DiskEvidence:
        """The stand-in for key destruction and wipe: unmounted, its backing file deleted."""
        self.detach(lease_id)
        self.image(lease_id).unlink(missing_ok=True)
        return DiskEvidence(details={"device": str(self.image(lease_id)), "method": "deleted"})

    destroy_key = wipe = destroy
