"""Network volumes on the node: each CephFS subvolume a lease has attached is mounted at
`<state>/volumes/lease-<id>/<name>` with the node's own cephx key (whose caps reach only
the subvolumes attached to this node's leases), and that lease directory is bind-mounted
into the instance at /volumes (slave propagation: a volume attached or detached while the
instance runs appears or disappears there without a restart).

Client: the kernel's CephFS client where the kernel has it (`client = "kernel"`), else
`ceph-fuse` (`client = "fuse"`); `"auto"` picks. A mount that fails is a named failure
(`volume_mount_failed`) reported with the lease; the other volumes and the instance carry on."""
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .interfaces import OperationFailed

log = logging.getLogger(__name__)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,59}$")
MOUNT_TIMEOUT = 60


@dataclass(frozen=True)
class Access:
    mon_host: str
    client_id: str
    key: str
    fs_name: str

    @classmethod
    def from_desired(cls, doc) -> "Access | None":
        if not isinstance(doc, dict):
            return None
        try:
            return cls(mon_host=str(doc["mon_host"]), client_id=str(doc["client_id"]), key=str(doc["key"]),
                       fs_name=str(doc.get("fs_name", "cephfs")))
        except KeyError:
            return None


def _mounts() -> dict[str, str]:
    """Mount point → file system type, from /proc/self/mounts."""
    out = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out[parts[1].replace("\\040", " ")] = parts[2]
    return out


class Volumes:
    def __init__(self, root: Path, *, client: str = "auto"):
        self.root = Path(root)
        self.client = client
        self._shared = False

    # -- paths ------------------------------------------------------------------------------
    def lease_dir(self, lease_id: int) -> Path:
        return self.root / f"lease-{lease_id}"

    def prepare(self, lease_id: int) -> str:
        """The lease's /volumes directory on the host (exists, on a shared mount)."""
        self._ensure_shared_root()
        path = self.lease_dir(lease_id)
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def _ensure_shared_root(self) -> None:
        """Docker's slave propagation needs the source on a shared mount: the root is bound
        onto itself and made shared once (as kubelet does for its pods' volumes)."""
        if self._shared:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        if str(self.root) not in _mounts():
            _run(["mount", "--bind", str(self.root), str(self.root)], "volume_mount_failed")
        _run(["mount", "--make-rshared", str(self.root)], "volume_mount_failed")
        self._shared = True

    # -- the desired volumes of one lease -------------------------------------------------
    def sync(self, lease_id: int, wanted: list[dict], access: Access | None) -> list[dict]:
        """Mount what is wanted, unmount what is not; one report item per wanted volume."""
        base = self.lease_dir(lease_id)
        wanted = [w for w in wanted if isinstance(w, dict) and NAME.match(str(w.get("name", "")))
                  and isinstance(w.get("path"), str) and type(w.get("volume_id")) is int]
        names = {w["name"] for w in wanted}
        mounts = _mounts()
        if base.is_dir():
            for entry in base.iterdir():
                if entry.name not in names:
                    self._unmount(entry, mounts)
        report = []
        for item in wanted:
            target = base / item["name"]
            try:
                if access is None:
                    raise OperationFailed("volume_mount_failed", "the storefront sent no storage access for "
                                                                 "this node")
                self._mount(target, item["path"], access, mounts)
                report.append({"volume_id": item["volume_id"], "mounted": True})
            except OperationFailed as exc:
                log.warning("lease %s: volume %s: %s", lease_id, item["name"], exc)
                report.append({"volume_id": item["volume_id"], "mounted": False,
                               "error": {"code": exc.code, "detail": f"{item['name']}: {exc.detail}"[:500]}})
        return report

    def release(self, lease_id: int) -> None:
        """The lease is gone from this node: unmount all its volumes (the data stays in Ceph)."""
        base = self.lease_dir(lease_id)
        if not base.is_dir():
            return
        mounts = _mounts()
        for entry in base.iterdir():
            self._unmount(entry, mounts)
        shutil.rmtree(base, ignore_errors=True)

    # -- mount / unmount ---------------------------------------------------------------------
    def _credentials(self, access: Access) -> tuple[Path, Path]:
        ceph_dir = self.root.parent / "ceph"
        ceph_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        keyring = ceph_dir / f"client.{access.client_id}.keyring"
        secret = ceph_dir / f"client.{access.client_id}.secret"
        conf = ceph_dir / "ceph.conf"
        for path, text in ((keyring, f"[client.{access.client_id}]\n\tkey = {access.key}\n"),
                           (secret, access.key + "\n"),
                           (conf, f"[global]\nmon host = {access.mon_host}\nlog file = /dev/null\n"
                                  "admin socket = \nfuse allow other = true\nclient quota = true\n"
                                  "client mount timeout = 20\n")):
            if not path.exists() or path.read_text() != text:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
        return conf, keyring

    def _use_kernel(self) -> bool:
        if self.client == "kernel":
            return True
        if self.client == "fuse":
            return False
        if Path("/sys/module/ceph").exists():
            return True
        try:
            return subprocess.run(["modprobe", "-q", "ceph"], capture_output=True, timeout=30).returncode == 0
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return False

    def _mount(self, target: Path, path: str, access: Access, mounts: dict[str, str]) -> None:
        if mounts.get(str(target)) in ("ceph", "fuse.ceph-fuse", "fuse"):
            if _readable(target):
                return
            self._unmount(target, mounts)          # a dead mount (evicted, cluster restarted)
        target.mkdir(parents=True, exist_ok=True)
        conf, keyring = self._credentials(access)
        if self._use_kernel():
            mons = ",".join(re.findall(r"(?:v1:)?(\d+\.\d+\.\d+\.\d+:\d+)", access.mon_host)) or access.mon_host
            argv = ["mount", "-t", "ceph", f"{mons}:{path}", str(target), "-o",
                    f"name={access.client_id},secretfile={keyring.with_suffix('.secret')},"
                    f"mds_namespace={access.fs_name}"]
        else:
            argv = ["ceph-fuse", "-c", str(conf), "-k", str(keyring), "--id", access.client_id,
                    "--client_fs", access.fs_name, "-r", path, str(target)]
        _run(argv, "volume_mount_failed")
        if str(target) not in _mounts() or not _readable(target):
            raise OperationFailed("volume_mount_failed", f"{target} is not mounted after {argv[0]}")
        log.info("mounted %s at %s", path, target)

    def _unmount(self, target: Path, mounts: dict[str, str]) -> None:
        if str(target) in mounts:
            subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=MOUNT_TIMEOUT)
            log.info("unmounted %s", target)
        try:
            target.rmdir()
        except OSError:
            pass


def _readable(path: Path) -> bool:
    try:
        os.listdir(path)
        return True
    except OSError:
        return False


def _run(argv: list[str], code: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=MOUNT_TIMEOUT)
    except FileNotFoundError:
        raise OperationFailed(code, f"{argv[0]} is not installed on this node") from None
    except subprocess.TimeoutExpired:
        raise OperationFailed(code, f"{argv[0]} did not finish within {MOUNT_TIMEOUT} s") from None
    if done.returncode != 0:
        raise OperationFailed(code, f"{' '.join(argv[:2])}: exit {done.returncode}: "
                                    f"{(done.stderr or done.stdout).strip()[-400:]}")
