"""Snapshots of a lease's local disk and restores from them, with restic.

One snapshot is one restic repository in its own RGW bucket, encrypted with its own
password: the storefront generates password and S3 key, sends them in the op, and the
agent hands them to restic in its environment only (never written on the node; restic runs
with `--no-cache`). Deleting the snapshot on the storefront forgets the password and
purges the bucket, which destroys the snapshot.

What is copied is the lease's *mounted file system* (`restic backup .` in the mount
point, `--one-file-system`), never the block device: the LUKS header and key are not in
it. Consistency: a running instance is paused (cgroup freezer, `docker pause`) while restic
reads, so no process writes mid-copy and what restic sees is one point in time as the
instance's processes see it; page-cache writes are visible to restic through the same
cache. The pause lasts the backup (restic reads the whole disk once per snapshot: each
snapshot is its own repository, deduplicated and compressed within itself); a block-layer
snapshot (dm-snapshot under the LUKS mapping) would shorten it and is the next step for
multi-TB disks.

Both run beside the converge loop on a worker thread: the loop keeps reporting (progress
and size from restic's JSON status lines) and leaves the lease's other operations waiting
while its snapshot runs. A failure is named (`snapshot_failed`, `snapshot_restore_failed`,
`snapshot_too_large`). A failed snapshot op stays failed: the storefront decides whether to
try again, with a new op_id (the snapshot's next attempt, bounded and audited there); an op
whose attempt the storefront gave up on while restic still runs has its restic killed
(`Job.cancel`). A failed restore is retried here after `RETRY_SECONDS`. restic dies with
the agent (PR_SET_PDEATHSIG); a restarted agent unpauses an instance left paused and starts
the op it is still sent again (restic writes its snapshot record last, so an interrupted
run leaves no snapshot, only unreferenced packs that the next run reuses)."""
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .interfaces import OperationFailed
from .runtime.instance_root import INSTANCE_ROOT

log = logging.getLogger(__name__)
RESTIC = "restic"
RETRY_SECONDS = 60              # a failed snapshot or restore is tried again after this
COMMAND_TIMEOUT = 600           # init, unlock, stats: small requests
PROGRESS_FPS = "1"              # restic --json status lines per second
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Repository:
    """Where one snapshot lives and the password that encrypts it (from the op)."""
    url: str                # "s3:http://rgw.example:7480/<bucket>"
    access_key: str
    secret_key: str
    password: str

    @classmethod
    def from_desired(cls, doc) -> "Repository":
        try:
            repo = cls(url=str(doc["url"]), access_key=str(doc["access_key"]),
                       secret_key=str(doc["secret_key"]), password=str(doc["password"]))
        except (KeyError, TypeError):
            raise OperationFailed("bad_desired_state", "snapshot repository needs url, access_key, "
                                  "secret_key and password") from None
        if not repo.url.startswith("s3:") or not repo.password:
            raise OperationFailed("bad_desired_state", "snapshot repository must be s3: with a password")
        return repo

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": "/root",
                "RESTIC_REPOSITORY": self.url, "RESTIC_PASSWORD": self.password,
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "RESTIC_PROGRESS_FPS": PROGRESS_FPS}


def _die_with_agent() -> None:
    """In the child before exec: SIGKILL when the agent dies, so no restic outlives it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Restic:
    def __init__(self, repo: Repository, *, code: str):
        self.repo, self.code = repo, code

    def run(self, *args: str, cwd: str | None = None, on_line: Callable[[dict], None] | None = None,
            timeout: float | None = COMMAND_TIMEOUT, job: "Job | None" = None) -> str:
        argv = [RESTIC, "--no-cache", "--json", *args]
        if job is not None and job.cancelled:
            raise OperationFailed(self.code, "cancelled: the storefront no longer asks for this op")
        try:
            process = subprocess.Popen(argv, cwd=cwd, env=self.repo.env(), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_agent)
        except FileNotFoundError:
            raise OperationFailed(self.code, "restic is not installed on this node") from None
        if job is not None:
            job.process = process
            if job.cancelled:           # cancelled between the check and the start
                process.kill()
        out, started = [], time.monotonic()
        for line in process.stdout:
            out.append(line)
            if on_line is not None and line.startswith("{"):
                try:
                    on_line(json.loads(line))
                except ValueError:
                    pass
            if timeout and time.monotonic() - started > timeout:
                process.kill()
        err = process.stderr.read()
        if process.wait() != 0:
            if job is not None and job.cancelled:
                raise OperationFailed(self.code, "cancelled: the storefront no longer asks for this op")
            raise OperationFailed(self.code, f"restic {args[0]}: exit {process.returncode}: "
                                             f"{err.strip()[-400:]}")
        return "".join(out)

    def ensure_initialised(self, job: "Job | None" = None) -> None:
        try:
            self.run("cat", "config", job=job)
        except OperationFailed:
            self.run("init", "--repository-version", "2", job=job)     # v2: compressed

    def stats(self, *args: str, job: "Job | None" = None) -> dict:
        return json.loads(self.run("stats", *args, job=job).strip().splitlines()[-1])


@dataclass
class Job:
    kind: str                       # "snapshot" | "restore"
    op_id: str
    state: str = "running"          # running | done | failed
    progress: dict = field(default_factory=dict)
    result: dict = field(default_factory=dict)
    error: tuple[str, str] | None = None
    ended: float = 0.0
    cancelled: bool = False
    process: subprocess.Popen | None = field(default=None, repr=False)

    def cancel(self) -> None:
        """The storefront gave this op up (a new attempt, or no snapshot any more): kill its
        restic; the worker then fails it and resumes a paused instance."""
        self.cancelled = True
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()

    def report(self) -> dict:
        error = {"code": self.error[0], "detail": self.error[1]} if self.error else None
        return {"op_id": self.op_id, "state": self.state, **self.progress, "error": error}


class Jobs:
    """One worker thread per running snapshot or restore, keyed by `<kind>:<lease>`."""

    def __init__(self):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Job | None:
        with self._lock:
            return self._jobs.get(key)

    def busy(self, lease_id: int) -> bool:
        with self._lock:
            return any(j.state == "running" for k, j in self._jobs.items() if k.endswith(f":{lease_id}"))

    def start(self, key: str, job: Job, work: Callable[[Job], dict]) -> None:
        with self._lock:
            self._jobs[key] = job
        threading.Thread(target=self._run, args=(job, work), name=key, daemon=True).start()

    def put(self, key: str, job: Job) -> None:
        """A job that failed before it could start (bad op, disk not mounted)."""
        with self._lock:
            self._jobs[key] = job

    def forget(self, key: str) -> None:
        with self._lock:
            self._jobs.pop(key, None)

    def _run(self, job: Job, work: Callable[[Job], dict]) -> None:
        try:
            job.result = work(job)
            job.state = "done"
        except OperationFailed as exc:
            log.warning("%s %s failed: %s", job.kind, job.op_id, exc)
            job.error, job.state = (exc.code, exc.detail), "failed"
        except Exception as exc:    # the worker must survive anything, and say so
            log.exception("%s %s failed unexpectedly", job.kind, job.op_id)
            job.error, job.state = (f"{job.kind}_failed", repr(exc)[:500]), "failed"
        job.ended = time.monotonic()

    def cancel(self, key: str) -> Job | None:
        """Cancel the key's running job; returns it while its worker is still ending."""
        job = self.get(key)
        if job is None or job.state != "running":
            return None
        job.cancel()
        return job

    def due_again(self, key: str) -> bool:
        """No job, or a failed one whose retry delay has passed."""
        job = self.get(key)
        return job is None or (job.state == "failed" and time.monotonic() - job.ended >= RETRY_SECONDS)


def take_snapshot(job: Job, *, repo: Repository, source: str, tags: list[str], pause, resume) -> dict:
    """restic backup of the mounted disk while the instance is paused; the facts of the
    `snapshot_taken` evidence."""
    restic = Restic(repo, code="snapshot_failed")
    restic.ensure_initialised(job)
    restic.run("unlock", job=job)           # a lock left by a run killed with the agent
    started_at, summary = _utc_now(), {}

    def progress(line: dict) -> None:
        if line.get("message_type") == "status":
            job.progress = {"bytes_done": int(line.get("bytes_done", 0)),
                            "total_bytes": int(line.get("total_bytes", 0)),
                            "percent": round(float(line.get("percent_done", 0)) * 100, 1)}
        elif line.get("message_type") == "summary":
            summary.update(line)

    paused_at = time.monotonic()
    paused = pause()
    try:
        tag_args = [a for tag in tags for a in ("--tag", tag)]
        # the instance's writable layer is the container's, not the customer's /workspace
        restic.run("backup", "--one-file-system", "--host", "gpu-node", *tag_args,
                   "--exclude", os.path.join(source, INSTANCE_ROOT), ".",
                   cwd=source, on_line=progress, timeout=None, job=job)
    finally:
        if paused:
            resume()
    paused_seconds = round(time.monotonic() - paused_at, 3) if paused else 0
    if not summary.get("snapshot_id"):
        raise OperationFailed("snapshot_failed", "restic backup ended without a snapshot")
    stored = restic.stats("--mode", "raw-data", job=job)
    return {"restic_snapshot": summary["snapshot_id"], "files": summary.get("total_files_processed", 0),
            "bytes": summary.get("total_bytes_processed", 0), "stored_bytes": stored.get("total_size", 0),
            "consistency": "instance paused" if paused else "instance not running",
            "paused_seconds": paused_seconds, "started_at": started_at, "finished_at": _utc_now()}


def restore_snapshot(job: Job, *, repo: Repository, restic_snapshot: str, target: str,
                     replace: bool = False) -> dict:
    """restic restore into the lease's mounted disk, refused if it does not fit. A new
    lease's disk is fresh; `replace` (a restore into an existing, stopped lease) first
    empties the disk, so that it then holds exactly the snapshot."""
    restic = Restic(repo, code="snapshot_restore_failed")
    needed = int(restic.stats("--mode", "restore-size", restic_snapshot, job=job).get("total_size", 0))
    usage = shutil.disk_usage(target)
    room = usage.total if replace else usage.free
    if needed > room:
        raise OperationFailed("snapshot_too_large", f"the snapshot holds {needed} bytes; the disk has "
                                                    f"{room} bytes {'in all' if replace else 'free'}")
    job.progress = {"total_bytes": needed}
    started_at, removed = _utc_now(), 0
    if replace:
        removed = empty_directory(target)
    restic.run("restore", restic_snapshot, "--target", target, timeout=None, job=job)
    return {"restic_snapshot": restic_snapshot, "bytes": needed, "started_at": started_at,
            "finished_at": _utc_now(), "replaced": replace, "entries_removed": removed}


def empty_directory(path: str) -> int:
    """Remove everything under the mount point (not the point itself, nor lost+found, nor
    the instance's own root file system, and never across into another file system); the
    number of top-level entries removed."""
    removed = 0
    device = os.stat(path).st_dev
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name in ("lost+found", INSTANCE_ROOT):   # the latter: the instance's root
                continue
            if entry.is_dir(follow_symlinks=False):
                if os.stat(entry.path, follow_symlinks=False).st_dev != device:
                    raise OperationFailed("snapshot_restore_failed", f"{entry.path} is another file system")
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
    return removed


def _utc_now() -> str:
    from .journal import utc_now
    return utc_now()
