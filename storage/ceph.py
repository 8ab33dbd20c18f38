"""The site's Ceph cluster, driven through its own command-line interfaces with JSON output
(`ceph` for the cluster, CephFS subvolumes and cephx; `radosgw-admin` for S3 users). No
Django here: `ClusterConfig` is what the operator configured (storage.models).

Every call fails in one of two named ways: `CephUnavailable` (the cluster did not answer:
down, unreachable, timed out) or `CephError` (it answered no; `.errno` is Ceph's). Both
carry the command's stderr for the operator; the customer sees a translated message."""
import atexit
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ENOENT, EEXIST, ENOSPC, EDQUOT = 2, 17, 28, 122
TIMEOUT_SECONDS = 30


class CephUnavailable(Exception):
    """The cluster did not answer (down, unreachable, timed out)."""


class CephError(Exception):
    def __init__(self, message: str, *, errno: int = 0):
        super().__init__(message)
        self.errno = errno


@dataclass(frozen=True)
class ClusterConfig:
    mon_host: str
    client_name: str                 # e.g. "client.storefront"
    client_key: str                  # its cephx secret
    fs_name: str = "cephfs"
    subvolume_group: str = "storefront"
    rgw_endpoint: str = ""           # the S3 endpoint shown to customers

    @property
    def client_id(self) -> str:
        return self.client_name.removeprefix("client.")


@dataclass(frozen=True, order=True)
class Grant:
    path: str                        # the subvolume's path in the CephFS
    pool: str                        # its data pool
    namespace: str                   # its own RADOS namespace (created --namespace-isolated)


@dataclass(frozen=True)
class PoolState:
    name: str
    size: int
    min_size: int


@dataclass(frozen=True)
class ClusterHealth:
    status: str                      # HEALTH_OK | HEALTH_WARN | HEALTH_ERR
    checks: tuple[str, ...]          # e.g. ("OSD_DOWN", "OSD_FULL")
    pools: tuple[PoolState, ...]
    full: bool                       # an OSD or pool is full: no new writes
    total_bytes: int
    used_bytes: int


class _Files:
    """A private conf and keyring for one cluster config (mode 0600 under a 0700 temp dir),
    so the key never appears on a command line."""
    _dirs: dict[str, Path] = {}

    @classmethod
    def for_config(cls, config: ClusterConfig) -> Path:
        digest = hashlib.sha256(repr(config).encode()).hexdigest()[:16]
        path = cls._dirs.get(digest)
        if path is None or not (path / "ceph.conf").exists():
            path = Path(tempfile.mkdtemp(prefix="storefront-ceph-"))
            atexit.register(shutil.rmtree, path, True)
            (path / "keyring").write_text(f"[{config.client_name}]\n\tkey = {config.client_key}\n")
            os.chmod(path / "keyring", 0o600)
            (path / "ceph.conf").write_text(
                f"[global]\nmon host = {config.mon_host}\nkeyring = {path / 'keyring'}\n"
                "log to stderr = false\nerr to stderr = true\nlog file = /dev/null\n")
            cls._dirs[digest] = path
        return path


def _errno(stderr: str, returncode: int) -> int:
    # `ceph` prints "Error ENOENT: ..." and exits with the errno.
    for name, number in (("ENOENT", ENOENT), ("EEXIST", EEXIST), ("ENOSPC", ENOSPC), ("EDQUOT", EDQUOT)):
        if f"Error {name}" in stderr:
            return number
    return returncode


class Ceph:
    """One cluster. Methods are idempotent where Ceph's commands allow (create on an existing
    subvolume, rm of a missing one with --force, deauthorize of a missing grant)."""

    def __init__(self, config: ClusterConfig, *, timeout: float = TIMEOUT_SECONDS):
        self.config, self.timeout = config, timeout

    # -- plumbing --------------------------------------------------------------------------
    def _argv(self, tool: str, args: tuple[str, ...]) -> list[str]:
        files = _Files.for_config(self.config)
        common = ["-c", str(files / "ceph.conf"), "-n", self.config.client_name]
        if tool == "ceph":
            common += ["--connect-timeout", str(int(self.timeout))]
        return [tool, *common, *args, "--format", "json"]

    def run(self, tool: str, *args: str) -> object:
        argv = self._argv(tool, args)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout + 5)
        except subprocess.TimeoutExpired:
            raise CephUnavailable(f"{tool} {' '.join(args[:3])}: no answer within {self.timeout:.0f} s") from None
        except FileNotFoundError:
            raise CephUnavailable(f"{tool} is not installed on the storefront host") from None
        if done.returncode != 0:
            err = done.stderr.strip()[-500:]
            if done.returncode == 110 or "timed out" in err or "RADOS timed out" in err or \
                    "error connecting to the cluster" in err:
                raise CephUnavailable(f"{tool} {' '.join(args[:3])}: {err}")
            raise CephError(f"{tool} {' '.join(args[:3])}: {err}", errno=_errno(err, done.returncode))
        out = done.stdout.strip()
        if not out:
            return None
        try:
            return json.loads(out)
        except json.JSONDecodeError:
            return out

    def ceph(self, *args: str) -> object:
        return self.run("ceph", *args)

    def rgw(self, *args: str) -> object:
        return self.run("radosgw-admin", *args)

    # -- the cluster -------------------------------------------------------------------------
    def health(self) -> ClusterHealth:
        status = self.ceph("status")
        checks = tuple(sorted((status.get("health") or {}).get("checks", {})))
        pools = tuple(PoolState(p["pool_name"], int(p["size"]), int(p["min_size"]))
                      for p in self.ceph("osd", "pool", "ls", "detail"))
        df = self.ceph("df")
        stats = df.get("stats", {})
        full = any(c in checks for c in ("OSD_FULL", "POOL_FULL"))
        return ClusterHealth(status=(status.get("health") or {}).get("status", "HEALTH_ERR"), checks=checks,
                             pools=pools, full=full, total_bytes=int(stats.get("total_bytes", 0)),
                             used_bytes=int(stats.get("total_used_raw_bytes", stats.get("total_used_bytes", 0))))

    def data_pools(self) -> tuple[str, ...]:
        """The CephFS's metadata and data pools: where network volumes live."""
        for fs in self.ceph("fs", "ls"):
            if fs["name"] == self.config.fs_name:
                return (fs["metadata_pool"], *fs["data_pools"])
        raise CephError(f"no CephFS named {self.config.fs_name!r}", errno=ENOENT)

    # -- CephFS subvolumes (network volumes) -----------------------------------------------------
    def _fs(self, verb: str, *args: str) -> object:
        return self.ceph("fs", "subvolume", verb, self.config.fs_name, *args)

    def group_ensure(self) -> None:
        self.ceph("fs", "subvolumegroup", "create", self.config.fs_name, self.config.subvolume_group)

    def subvolume_create(self, name: str, *, size_bytes: int) -> str:
        """Create (or find) the subvolume with its quota; returns its path in the CephFS.
        Its data sits in its own RADOS namespace, so a key scoped to it reads nothing else."""
        self.group_ensure()
        self._fs("create", name, "--size", str(size_bytes), "--group_name", self.config.subvolume_group,
                 "--namespace-isolated", "--mode", "0777")
        self.subvolume_resize(name, size_bytes=size_bytes)
        return self.subvolume_path(name)

    def subvolume_resize(self, name: str, *, size_bytes: int) -> None:
        self._fs("resize", name, str(size_bytes), "--group_name", self.config.subvolume_group, "--no_shrink")

    def subvolume_path(self, name: str) -> str:
        path = self._fs("getpath", name, "--group_name", self.config.subvolume_group)
        return path if isinstance(path, str) else str(path)

    def subvolume_info(self, name: str) -> dict | None:
        try:
            return self._fs("info", name, "--group_name", self.config.subvolume_group)
        except CephError as exc:
            if exc.errno == ENOENT:
                return None
            raise

    def subvolume_remove(self, name: str) -> None:
        """Delete the subvolume and purge its data (the mgr's purge queue); absent is done."""
        self._fs("rm", name, "--group_name", self.config.subvolume_group, "--force")

    def subvolume_names(self) -> list[str]:
        """The storefront's subvolumes; none before the first one made their group."""
        try:
            rows = self._fs("ls", "--group_name", self.config.subvolume_group) or []
        except CephError as exc:
            if "does not exist" in str(exc):
                return []
            raise
        return [row["name"] for row in rows]

    # -- cephx for nodes: a key scoped to exactly the subvolumes attached to a node's leases ------
    def subvolume_grant(self, name: str) -> "Grant":
        """What a key needs to use one subvolume: its path (MDS) and its RADOS namespace."""
        info = self._fs("info", name, "--group_name", self.config.subvolume_group)
        return Grant(path=self.subvolume_path(name), pool=info["data_pool"],
                     namespace=info.get("pool_namespace", ""))

    def node_access_set(self, auth_id: str, grants: list["Grant"]) -> str:
        """Set `client.<auth_id>`'s caps to exactly these subvolumes (nothing else: no other
        path, no other RADOS namespace) and return its key. Idempotent; with no grants the
        key can reach the monitors and nothing stored."""
        entity = f"client.{auth_id}"
        key = self.ceph("auth", "get-or-create-key", entity)
        key = key.get("key") if isinstance(key, dict) else key
        caps = ["mon", "allow r"]
        if grants:
            caps += ["mds", ", ".join(f"allow rw path={g.path}" for g in sorted(grants)),
                     "osd", ", ".join(f"allow rw pool={g.pool}" + (f" namespace={g.namespace}" if g.namespace else "")
                                      for g in sorted(grants))]
        self.ceph("auth", "caps", entity, *caps)
        return str(key)

    def node_evict(self, auth_id: str, *, path: str) -> None:
        """End the sessions `client.<auth_id>` holds on `path` (a detached volume): the MDS
        evicts and blocklists them, so an open mount cannot read on with cached caps."""
        self.ceph("tell", f"mds.{self.config.fs_name}:0", "client", "evict", f"auth_name={auth_id}",
                  f"client_metadata.root={path}")

    def auth_caps(self, auth_id: str) -> dict:
        try:
            rows = self.ceph("auth", "get", f"client.{auth_id}")
        except CephError as exc:
            if exc.errno == ENOENT:
                return {}
            raise
        return rows[0].get("caps", {}) if rows else {}

    # -- RGW (object storage) -------------------------------------------------------------------
    def s3_user_ensure(self, uid: str, *, display_name: str, max_bytes: int) -> dict:
        try:
            user = self.rgw("user", "info", f"--uid={uid}")
        except CephError as exc:
            if exc.errno != ENOENT and "could not fetch user info" not in str(exc):
                raise
            user = self.rgw("user", "create", f"--uid={uid}", f"--display-name={display_name}",
                            "--max-buckets=100")
        self.s3_quota_set(uid, max_bytes=max_bytes)
        return user

    def s3_quota_set(self, uid: str, *, max_bytes: int) -> None:
        self.rgw("quota", "set", "--quota-scope=user", f"--uid={uid}", f"--max-size={max_bytes}")
        self.rgw("quota", "enable", "--quota-scope=user", f"--uid={uid}")

    def s3_key_create(self, uid: str) -> tuple[str, str]:
        """A new access key pair for the user: (access key, secret), the secret shown once."""
        before = {k["access_key"] for k in self.rgw("user", "info", f"--uid={uid}")["keys"]}
        user = self.rgw("key", "create", f"--uid={uid}", "--key-type=s3", "--gen-access-key", "--gen-secret")
        for key in user["keys"]:
            if key["access_key"] not in before:
                return key["access_key"], key["secret_key"]
        raise CephError("radosgw-admin key create returned no new key")

    def s3_key_remove(self, uid: str, access_key: str) -> None:
        try:
            self.rgw("key", "rm", f"--uid={uid}", "--key-type=s3", f"--access-key={access_key}")
        except CephError as exc:
            if exc.errno != ENOENT and "invalid access key" not in str(exc):
                raise

    def s3_user_suspend(self, uid: str) -> None:
        self.rgw("user", "suspend", f"--uid={uid}")

    def s3_user_remove(self, uid: str) -> None:
        try:
            self.rgw("user", "rm", f"--uid={uid}", "--purge-data")
        except CephError as exc:
            if exc.errno != ENOENT and "could not fetch user info" not in str(exc):
                raise

    def s3_bytes_stored(self, uid: str) -> int:
        """Bytes the user stores now, from RGW's own accounting (synced first)."""
        stats = self.rgw("user", "stats", f"--uid={uid}", "--sync-stats")
        return int((stats or {}).get("stats", {}).get("size", 0))
