"""The single-host test Ceph cluster (scripts/ceph-test-cluster.sh) from Python, for any
test that needs real Ceph storage (network volumes, S3, snapshot repositories):

    from tests.storage.ceph_cluster import running_cluster
    with running_cluster(tmp_dir) as cluster:
        cluster.conf, cluster.keyring          # client.admin
        cluster.rgw_endpoint                   # http://127.0.0.1:<free port>
        cluster.rgw_access_key, cluster.rgw_secret_key   # an RGW user with admin caps
        cluster.ceph("fs", "subvolume", "ls", "cephfs")  # JSON-decoded output

or the session fixture `ceph_cluster` (tests/storage/conftest.py). No Django here."""
import json
import os
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ceph-test-cluster.sh"
BOOT_TIMEOUT = 600      # a first boot builds the cache (mkfs of 3 OSDs); later boots ~20 s


@dataclass
class CephTestCluster:
    dir: Path
    conf: str
    keyring: str
    fs: str
    mon_host: str
    rgw_endpoint: str
    rgw_access_key: str
    rgw_secret_key: str
    boot_seconds: float = 0.0

    def ceph(self, *args: str, timeout: float = 60) -> object:
        out = subprocess.run(["ceph", "-c", self.conf, "-k", self.keyring, *args, "-f", "json"],
                             capture_output=True, text=True, timeout=timeout, check=True).stdout
        return json.loads(out) if out.strip() else None

    def osd_stop(self, osd: int) -> None:
        subprocess.run([str(SCRIPT), "osd-stop", str(self.dir), str(osd)], check=True, timeout=60)

    def osd_start(self, osd: int) -> None:
        subprocess.run([str(SCRIPT), "osd-start", str(self.dir), str(osd)], check=True, timeout=60)

    def daemon_pids(self) -> list[int]:
        pids = []
        for pidfile in (self.dir / "run").glob("*.pid"):
            try:
                pids.append(int(pidfile.read_text().strip()))
            except (OSError, ValueError):
                pass
        return pids

    def rss_bytes(self) -> int:
        """Resident memory of all the cluster's daemons."""
        total = 0
        for pid in self.daemon_pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return total


def _parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def start(directory: Path) -> CephTestCluster:
    started = time.monotonic()
    result = subprocess.run([str(SCRIPT), "start", str(directory)], capture_output=True, text=True,
                            timeout=BOOT_TIMEOUT, env={**os.environ})
    if result.returncode != 0:
        raise RuntimeError(f"ceph-test-cluster.sh start failed:\n{result.stderr[-4000:]}")
    env = _parse_env(result.stdout)
    return CephTestCluster(
        dir=Path(directory), conf=env["CEPH_CONF"], keyring=env["CEPH_KEYRING"], fs=env["CEPH_FS"],
        mon_host=env["CEPH_MON_HOST"], rgw_endpoint=env["CEPH_RGW_ENDPOINT"],
        rgw_access_key=env["CEPH_RGW_ACCESS_KEY"], rgw_secret_key=env["CEPH_RGW_SECRET_KEY"],
        boot_seconds=time.monotonic() - started)


def stop(directory: Path) -> None:
    subprocess.run([str(SCRIPT), "stop", str(directory)], capture_output=True, timeout=120)


@contextmanager
def running_cluster(directory: Path):
    try:
        yield start(directory)
    finally:
        stop(directory)
