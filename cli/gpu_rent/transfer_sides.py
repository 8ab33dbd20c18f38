"""The two sides of a `gpu-rent cp` (transfer.py): the local file system and the lease's
instance over SFTP, with the same small interface (stat, list, open for reading and for
appending, the SHA-256 of a file's first bytes, rename), and the pipelined SFTP reader and
writer both directions use (paramiko's own drop refused writes and read parts twice)."""
from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import re
import shlex
import shutil
import stat
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

CHUNK = 256 * 1024                  #: one read from the source, one progress step


@dataclass
class Stat:
    size: int
    mtime: float
    mode: int
    kind: str   # "file", "dir" or "other"


def _stat(st) -> Stat:
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return Stat(size=st.st_size or 0, mtime=st.st_mtime or 0, mode=stat.S_IMODE(st.st_mode or 0), kind=kind)


class LocalSide:
    path = os.path
    remote = False

    def describe(self, name: str) -> str:
        return name

    def stat(self, name: str) -> Stat | None:
        try:
            return _stat(os.stat(name))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def listdir(self, name: str) -> list[str]:
        return sorted(os.listdir(name))

    def realpath(self, name: str) -> str:
        return os.path.realpath(name)

    def mkdir(self, name: str) -> None:
        os.mkdir(name, 0o755)

    def prefix_sha256(self, name: str, size: int) -> str:
        digest = hashlib.sha256()
        for data in self.reader(name, 0, size):
            digest.update(data)
        return digest.hexdigest()

    def reader(self, name: str, offset: int, end: int | None = None):
        with open(name, "rb") as handle:
            handle.seek(offset)
            left = None if end is None else end - offset
            while left is None or left > 0:
                data = handle.read(CHUNK if left is None else min(CHUNK, left))
                if not data:
                    return
                if left is not None:
                    left -= len(data)
                yield data

    @contextmanager
    def writer(self, name: str, offset: int):
        with open(name, "r+b" if offset else "wb") as handle:
            handle.seek(offset)
            handle.truncate()
            yield handle
            handle.flush()
            os.fsync(handle.fileno())   # the rename below must not publish a file still in the cache

    def finish(self, part: str, final: str, mode: int, mtime: float) -> None:
        os.chmod(part, mode)
        os.utime(part, (mtime, mtime))
        os.replace(part, final)

    def free_bytes(self, directory: str) -> int | None:
        try:
            return shutil.disk_usage(directory or ".").free
        except OSError:
            return None


class RemoteSide:
    path = posixpath
    remote = True

    def __init__(self, conn: remote.Connection):
        self.conn, self.sftp = conn, conn.sftp

    def describe(self, name: str) -> str:
        return f"{self.conn.lease_id}:{name}"

    def stat(self, name: str) -> Stat | None:
        try:
            return _stat(self.sftp.stat(name))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise

    def listdir(self, name: str) -> list[str]:
        return sorted(self.sftp.listdir(name))

    def realpath(self, name: str) -> str:
        return self.sftp.normalize(name)

    def mkdir(self, name: str) -> None:
        self.sftp.mkdir(name, 0o755)

    def _run(self, command: str) -> tuple[int, str, str]:
        channel = self.conn.client.get_transport().open_session()
        try:
            channel.exec_command(command)
            out, err = channel.makefile("rb").read(), channel.makefile_stderr("rb").read()
            return channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")
        finally:
            channel.close()

    @staticmethod
    def _shell_path(name: str) -> str:
        return shlex.quote(name if name.startswith("/") else "./" + name)   # never read as an option

    def prefix_sha256(self, name: str, size: int) -> str:
        status, out, err = self._run(f"head -c {int(size)} {self._shell_path(name)} | sha256sum")
        found = re.match(r"([0-9a-f]{64})\b", out)
        if status == 0 and found and not err.strip():
            return found.group(1)
        digest = hashlib.sha256()       # no head/sha256sum on this image: read the prefix back
        for data in self.reader(name, 0, size):
            digest.update(data)
        return digest.hexdigest()

    def reader(self, name: str, offset: int, end: int | None = None):
        with self.sftp.open(name, "rb") as handle:
            yield from PipelinedReader(self.sftp, handle, offset, handle.stat().st_size if end is None else end)

    @contextmanager
    def writer(self, name: str, offset: int):
        handle = self.sftp.open(name, "r+b" if offset else "wb")
        try:
            handle.set_pipelined(True)
            handle.seek(offset)
            writer = PipelinedWriter(self.sftp, handle)
            yield writer
            writer.collect_all()
        finally:
            handle.close()

    def finish(self, part: str, final: str, mode: int, mtime: float) -> None:
        self.sftp.chmod(part, mode)
        self.sftp.utime(part, (mtime, mtime))
        try:
            self.sftp.posix_rename(part, final)     # replaces the destination in one step
        except OSError:
            if self.stat(final) is not None:         # a server without posix-rename@openssh.com
                self.sftp.remove(final)
            self.sftp.rename(part, final)

    def free_bytes(self, directory: str) -> int | None:
        try:
            status, out, _err = self._run(f"df -Pk {self._shell_path(directory or '.')}")
            return int(out.splitlines()[1].split()[3]) * 1024 if status == 0 else None
        except (OSError, EOFError, IndexError, ValueError):
            return None


class PipelinedReader:
    """Reads that do not wait for each reply (a long link stays full), at most IN_FLIGHT at a
    time, yielded in order: memory stays bounded however slow the writer (--limit-rate).
    paramiko's own prefetch holds the whole file in memory for a slow reader, and with a cap
    on its requests it races itself and reads parts twice (a third more bytes, measured here),
    so this asks for each piece once. It uses paramiko's SFTPClient._async_request and
    _read_response, like PipelinedWriter below (the pinned paramiko==5.0.0; OpenSSH answers
    in order, and the oldest request is always the one waited for)."""

    IN_FLIGHT = 64      #: read requests of REQUEST bytes: 2 MB asked for and not yet read
    REQUEST = 32768     #: what every SFTP server answers in one piece

    def __init__(self, sftp, handle, offset: int, end: int):
        from paramiko.sftp import CMD_READ, int64  # paramiko is loaded by then (remote.connect)

        self.sftp, self.handle, self.offset, self.end = sftp, handle, offset, end
        self._read, self._int64 = CMD_READ, int64

    def _ask(self, at: int, length: int) -> int:
        return self.sftp._async_request(type(None), self._read, self.handle.handle, self._int64(at), int(length))

    def _answer(self, number: int) -> bytes:
        """The data of request `number`; b"" at the end of the file."""
        try:
            _kind, msg = self.sftp._read_response(number)
        except EOFError:
            return b""
        return msg.get_string()

    def __iter__(self):
        asked, position = deque(), self.offset
        while asked or position < self.end:
            while len(asked) < self.IN_FLIGHT and position < self.end:
                length = min(self.REQUEST, self.end - position)
                asked.append((self._ask(position, length), position, length))
                position += length
            number, at, length = asked.popleft()
            data = self._answer(number)
            while data and len(data) < length:        # a short answer: ask for the rest at once
                more = self._answer(self._ask(at + len(data), length - len(data)))
                if not more:
                    break
                data += more
            if not data:                              # the file shrank while it was read
                for number, _at, _length in asked:
                    self._answer(number)
                return
            yield data


class PipelinedWriter:
    """Writes that do not wait for each reply (a long link stays full), whose replies are all
    read and checked. paramiko's pipelined SFTPFile reads them only now and then and drops the
    rest at close(), so a write the server refused (its disk full) would pass unnoticed and
    the copy be renamed into place short. Here at most IN_FLIGHT wait for their reply, the
    oldest read first (OpenSSH answers in order); a refused one raises OSError at once.
    This reaches into paramiko's SFTPFile (its _reqs and SFTPClient._read_response): the
    pinned paramiko==5.0.0, and tests/automation/test_cli_cp.py's full-disk test, keep it true."""

    IN_FLIGHT = 64      #: write requests of up to 32 kB each: 2 MB unconfirmed at most

    def __init__(self, sftp, handle):
        self.sftp, self.handle = sftp, handle

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        while len(self.handle._reqs) > self.IN_FLIGHT:
            self._collect_one()

    def _collect_one(self) -> None:
        self.sftp._read_response(self.handle._reqs.popleft())   # raises OSError for a refused write

    def collect_all(self) -> None:
        self.handle.flush()
        while self.handle._reqs:
            self._collect_one()
