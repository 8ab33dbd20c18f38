"""`gpu-rent cp SRC DST`: files and directories to and from a lease's instance, over its SSH
(SFTP, with paramiko: remote.py), resumable.

Exactly one side is the lease, written `LEASE_ID:/path` (a path without a leading / is under
the login's home directory; `LEASE_ID:` alone is the home directory).

Resuming: a file is written to `NAME.gpu-rent-part` beside its destination and renamed to NAME
only when complete, with the source's mode and modification time. Run again after an
interruption, each file is
- skipped when the destination already has the source's size and modification time (what the
  finished copy was given: the quick check rsync makes);
- continued when a `.gpu-rent-part` is there and its bytes are the source's first bytes: the
  SHA-256 of that prefix is computed on both sides (on the instance by `head -c N | sha256sum`,
  or, on an image without them, by reading the part back over SFTP), and only the rest is sent;
- copied again from the start when the prefix differs (the source changed in between).

A directory is copied INTO the destination as DST/NAME, like rsync (end SRC with / to copy
what is in it instead): so the same command, run again, continues the same tree instead of
nesting a second copy inside the first, as `cp -r` would."""
from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass

from . import remote
from .errors import FAILED, NO_SPACE, NOT_FOUND, REFUSED, SSH_FAILED, USAGE, CliError
from .output import emit_json
from .transfer_sides import LocalSide, RemoteSide, Stat

PART_SUFFIX = ".gpu-rent-part"
PROGRESS_EVERY_SECONDS = 0.2        #: a terminal's progress line is redrawn at most this often
LOW_SPACE_BYTES = 1024 * 1024       #: a failed write with less free than this is "disk full"
ENDPOINT = re.compile(r"^(\d+):(.*)$", re.S)
RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)(?:i?b)?(?:/s)?$", re.I)


def add_parser(add) -> None:
    p = add("cp", "copy files to or from a lease's instance over its SSH; run again to resume",
            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
                "One side is LEASE_ID:PATH. A directory (-r) is copied into DST as DST/NAME, like rsync;\n"
                "end SRC with / to copy what is in it. Run an interrupted copy again: it continues.\n\n"
                "  gpu-rent cp model.safetensors 12:/workspace/\n"
                "  gpu-rent cp -r ./dataset 12:/workspace/        # /workspace/dataset\n"
                "  gpu-rent cp -r 12:/workspace/checkpoints/ ./ckpt"))
    p.add_argument("source", metavar="SRC", help="a local path, or LEASE_ID:PATH")
    p.add_argument("destination", metavar="DST", help="a local path, or LEASE_ID:PATH")
    p.add_argument("-r", "--recursive", action="store_true", help="copy directories")
    p.add_argument("-i", "--identity", metavar="KEY", help="private key file (default: ssh-agent and ~/.ssh)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or notes, only errors")
    p.add_argument("--user", default="root", help="login on the instance (default root)")
    p.add_argument("--limit-rate", metavar="RATE", help="at most this many bytes/s, e.g. 500K, 20M")


@dataclass
class Job:
    source: str
    destination: str
    stat: Stat
    shown: str          # the name progress and messages use


def human(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def parse_rate(text: str | None) -> float | None:
    if not text:
        return None
    found = RATE.match(text.strip())
    if not found or float(found.group(1)) <= 0:
        raise CliError(USAGE, f"--limit-rate takes bytes per second like 500K or 20M, not {text!r}.")
    return float(found.group(1)) * 1024 ** " kmg".index(found.group(2).lower() or " ")


class RateLimit:
    def __init__(self, rate: float | None):
        self.rate, self.started, self.count = rate, None, 0

    def take(self, count: int) -> None:
        if not self.rate:
            return
        if self.started is None:
            self.started = time.monotonic()
        self.count += count
        ahead = self.count / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(ahead)   # pacing the copy itself, the point of --limit-rate


class Progress:
    """One redrawn line per file on a terminal (stderr); notes unless quiet; nothing else."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.live = not quiet and sys.stderr.isatty()

    def note(self, text: str) -> None:
        if not self.quiet:
            self._clear()
            print(f"gpu-rent: {text}", file=sys.stderr, flush=True)

    def start(self, shown: str, size: int, offset: int) -> None:
        self.shown, self.size, self.done, self.sent = shown, size, offset, 0
        self.started = self.drawn = time.monotonic()
        self._draw()

    def advance(self, count: int) -> None:
        self.done += count
        self.sent += count
        if self.live and time.monotonic() - self.drawn >= PROGRESS_EVERY_SECONDS:
            self._draw()

    def finish(self, status: str) -> None:
        if self.live:
            self._draw(status)
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, status: str = "") -> None:
        if not self.live:
            return
        self.drawn = now = time.monotonic()
        pct = 100 if not self.size else min(100, self.done * 100 // self.size)
        speed = self.sent / (now - self.started) if now > self.started else 0
        line = (f"{self.shown[-40:]:<40} {pct:3d}% {human(self.done):>9}/{human(self.size):<9} "
                f"{human(speed):>9}/s {status}")
        sys.stderr.write("\r" + line.rstrip()[: shutil.get_terminal_size().columns - 1] + "\x1b[K")
        sys.stderr.flush()

    def _clear(self) -> None:
        if self.live:
            sys.stderr.write("\r\x1b[K")


# --- the command ------------------------------------------------------------------------------

def split_endpoint(text: str) -> tuple[int | None, str]:
    found = ENDPOINT.match(text)
    if not found:
        return None, text
    path = found.group(2)
    if path == "~" or path.startswith("~/"):    # SFTP has no ~; a relative path is the home's
        path = path[2:]
    return int(found.group(1)), path or "."


def _lease_address(api, lease_id: int) -> tuple[str, int]:
    lease = api.get(f"leases/{lease_id}")
    ssh = lease.get("ssh")
    if not ssh:
        raise CliError(REFUSED, f"Lease #{lease_id} is {lease['state']}: only a running (active) lease's instance "
                                "can be copied to or from.", error="not_running")
    return ssh["host"], int(ssh["port"])


def run(api, args) -> int:
    (src_lease, src), (dst_lease, dst) = split_endpoint(args.source), split_endpoint(args.destination)
    if (src_lease is None) == (dst_lease is None):
        raise CliError(USAGE, "Exactly one of SRC and DST is on the lease, written LEASE_ID:PATH "
                              "(e.g. gpu-rent cp model.pt 12:/workspace/).")
    rate = parse_rate(args.limit_rate)
    lease_id = src_lease if src_lease is not None else dst_lease
    upload = dst_lease is not None
    if upload and not os.path.exists(src):   # before any connection: a typo costs nothing
        raise CliError(NOT_FOUND, f"No such file or directory: {src}", error="no_such_path")
    host, port = _lease_address(api, lease_id)
    conn = remote.connect(lease_id, host, port, user=args.user, key_file=args.identity,
                          quiet=args.quiet)
    ui = Progress(args.quiet)
    started = time.monotonic()
    try:
        local, far = LocalSide(), RemoteSide(conn)
        source_side, dest_side = (local, far) if upload else (far, local)
        copy = Copy(source_side, dest_side, ui, RateLimit(rate), lease_id)
        try:
            jobs = copy.plan(src, dst, args.recursive)
            results = [copy.file(job) for job in jobs]
        except (OSError, EOFError) as exc:
            raise copy.failure(exc) from None
        except Exception as exc:  # paramiko's SSHException: the link broke
            if exc.__class__.__module__.startswith("paramiko"):
                raise copy.failure(exc) from None
            raise
    finally:
        conn.close()
    elapsed = time.monotonic() - started
    report = {"lease": lease_id, "direction": "upload" if upload else "download", "files": results,
              "copied": sum(r["status"] != "up_to_date" for r in results),
              "up_to_date": sum(r["status"] == "up_to_date" for r in results),
              "sent_bytes": sum(r["sent"] for r in results),
              "resumed_bytes": sum(r["resumed_from"] for r in results if r["status"] == "resumed"),
              "elapsed_s": round(elapsed, 3), "host_key": conn.host_key}
    if args.json:
        emit_json(report)
    elif not args.quiet:
        kept = f", {human(report['resumed_bytes'])} kept from an earlier try" if report["resumed_bytes"] else ""
        same = f", {report['up_to_date']} already up to date" if report["up_to_date"] else ""
        print(f"{report['copied']} file(s) copied{same}: {human(report['sent_bytes'])} sent{kept} in "
              f"{elapsed:.1f} s.", file=sys.stderr)
    return 0


class Copy:
    def __init__(self, source: LocalSide | RemoteSide, dest: LocalSide | RemoteSide, ui: Progress,
                 limit: RateLimit, lease_id: int):
        self.source, self.dest, self.ui, self.limit, self.lease_id = source, dest, ui, limit, lease_id
        self.current: Job | None = None

    # -- what to copy where

    def plan(self, src: str, dst: str, recursive: bool) -> list[Job]:
        s, d = self.source, self.dest
        st = s.stat(src)
        if st is None:
            raise CliError(NOT_FOUND, f"No such file or directory: {s.describe(src)}", error="no_such_path")
        if st.kind == "other":
            raise CliError(USAGE, f"{s.describe(src)} is neither a file nor a directory.")
        dst_st = d.stat(dst)
        if st.kind == "file":
            if dst.endswith("/") or (dst_st and dst_st.kind == "dir"):
                self._need_dir(dst)
                target = d.path.join(dst, s.path.basename(src))
            else:
                self._need_dir(d.path.dirname(dst) or ".")
                target = dst
            return [Job(src, target, st, s.path.basename(src))]
        if not recursive:
            raise CliError(USAGE, f"{s.describe(src)} is a directory: add -r to copy it.")
        name = s.path.basename(s.path.normpath(src))
        if dst_st is None:
            self._need_dir(d.path.dirname(dst.rstrip("/")) or ".")
            d.mkdir(dst.rstrip("/"))
        elif dst_st.kind != "dir":
            raise CliError(USAGE, f"{d.describe(dst)} is not a directory: a directory is copied into one.")
        into = src.endswith("/") or name in ("", ".", "..")
        return self._walk(src, dst if into else d.path.join(dst, name), "" if into else name)

    def _need_dir(self, directory: str) -> None:
        st = self.dest.stat(directory)
        if st is None or st.kind != "dir":
            raise CliError(NOT_FOUND, f"No such directory: {self.dest.describe(directory)}", error="no_such_path")

    def _walk(self, src_root: str, dst_root: str, shown_root: str) -> list[Job]:
        """Every file under src_root, directories made on the way (symlinks followed, like
        scp -r, but a directory is visited once: a link back up is not a loop)."""
        s, d = self.source, self.dest
        jobs, seen, todo = [], set(), [(src_root, dst_root, shown_root)]
        while todo:
            src_dir, dst_dir, shown = todo.pop(0)
            real = s.realpath(src_dir)
            if real in seen:
                self.ui.note(f"skipped {s.describe(src_dir)}: a link to a directory already copied")
                continue
            seen.add(real)
            existing = d.stat(dst_dir)
            if existing is None:
                d.mkdir(dst_dir)
            elif existing.kind != "dir":
                raise CliError(USAGE, f"{d.describe(dst_dir)} is in the way: it is not a directory.")
            for name in s.listdir(src_dir):
                if name.endswith(PART_SUFFIX):
                    continue        # another copy's unfinished file
                path, label = s.path.join(src_dir, name), f"{shown}/{name}" if shown else name
                st = s.stat(path)
                if st is None or st.kind == "other":
                    self.ui.note(f"skipped {s.describe(path)}: " + ("a dangling link" if st is None
                                                                   else "not a file or directory"))
                elif st.kind == "dir":
                    todo.append((path, d.path.join(dst_dir, name), label))
                else:
                    jobs.append(Job(path, d.path.join(dst_dir, name), st, label))
        return jobs

    # -- one file

    def file(self, job: Job) -> dict:
        self.current = job
        s, d, st = self.source, self.dest, job.stat
        result = {"source": s.describe(job.source), "destination": d.describe(job.destination), "size": st.size,
                  "sent": 0, "resumed_from": 0, "status": "copied"}
        existing = d.stat(job.destination)
        if existing and existing.kind == "dir":
            raise CliError(USAGE, f"{d.describe(job.destination)} is a directory: cannot copy a file over it.")
        if existing and existing.size == st.size and int(existing.mtime) == int(st.mtime):
            return {**result, "status": "up_to_date"}
        part = job.destination + PART_SUFFIX
        offset, kept = 0, d.stat(part)
        if kept and kept.kind == "file" and kept.size:
            if kept.size <= st.size:
                self.ui.note(f"checking the {human(kept.size)} of {job.shown} an earlier try copied")
                if s.prefix_sha256(job.source, kept.size) == d.prefix_sha256(part, kept.size):
                    offset, result["status"] = kept.size, "resumed"
            if not offset:
                result["status"] = "restarted"
                self.ui.note(f"{job.shown} changed since the interrupted copy: copying it again from the start")
        result["resumed_from"] = offset
        self.ui.start(job.shown, st.size, offset)
        with d.writer(part, offset) as out:
            for data in s.reader(job.source, offset):
                out.write(data)
                result["sent"] += len(data)
                self.ui.advance(len(data))
                self.limit.take(len(data))
        d.finish(part, job.destination, st.mode, st.mtime)
        self.ui.finish(result["status"])
        self.current = None
        return result

    # -- what went wrong

    def failure(self, exc: BaseException) -> CliError:
        job, lease = self.current, f"lease #{self.lease_id}"
        where = f" ({job.shown})" if job else ""
        again = "What was copied is kept: run the same command again to continue from there."
        code = getattr(exc, "errno", None)
        if code in (errno.ENOSPC, errno.EDQUOT):
            return CliError(NO_SPACE, f"No space left on this computer's disk{where}. {again}", error="no_space")
        transport = self.dest.conn if self.dest.remote else self.source.conn
        alive = transport.client.get_transport() is not None and transport.client.get_transport().is_active()
        if not alive or isinstance(exc, EOFError | socket.timeout | TimeoutError) or exc.__class__.__module__.startswith(
                "paramiko"):
            return CliError(SSH_FAILED, f"The SSH connection to {lease} broke{where}: {remote._reason(exc)}. {again}",
                            error="ssh_failed")
        if self.dest.remote and job is not None:
            free = self.dest.free_bytes(self.dest.path.dirname(job.destination))
            if free is not None and free < max(LOW_SPACE_BYTES, 1):
                return CliError(NO_SPACE, f"No space left on {lease}'s disk{where}: {human(free)} free. {again}",
                                error="no_space", detail={"free_bytes": free})
        if code == errno.ENOENT:
            return CliError(NOT_FOUND, f"No such file or directory{where}: {exc}", error="no_such_path")
        if code in (errno.EACCES, errno.EPERM):
            return CliError(FAILED, f"Permission denied{where}: {exc}", error="permission_denied")
        return CliError(FAILED, f"The copy failed{where}: {remote._reason(exc)}", error="copy_failed")
