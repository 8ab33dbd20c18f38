"""A throwaway OpenSSH server for the tests of `gpu-rent cp`: its own host key, one authorized
key, a free port on 127.0.0.1, everything in a temp dir. Its SFTP server logs every file it
closes with the bytes read and written (`sftp-server -l INFO`) to sftp.log, so a test counts
what crossed the wire on the server's side, not by the client's word."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.deadlines import scaled, wait_for
from tests.tools import require

SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server",
                "/usr/libexec/sftp-server")
CLOSED = re.compile(r'(forced )?close "(?P<path>[^"]*)" bytes read (?P<read>\d+) written (?P<written>\d+)')


def keygen(path: Path) -> Path:
    """An Ed25519 key pair without a passphrase: path and path.pub."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)], check=True,
                   timeout=scaled(30))
    return path


def held_open(path: Path | str) -> bool:
    """Whether any process has `path` open (Linux /proc): after a client is killed, the server's
    SFTP process may still be writing what it had received, or be dying of a closed pipe (then it
    logs nothing), so "nothing holds the file" is what says the server is done with it."""
    target = os.path.realpath(path)
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                if os.readlink(fd) == target:
                    return True
        except OSError:     # gone meanwhile, or not ours to read
            continue
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Sshd:
    def __init__(self, directory: Path, authorized_key: str):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "authorized_keys").write_text(authorized_key.strip() + "\n")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.extra: list[str] = []      # more sshd_config lines
        self.binary = shutil.which("sshd", path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))
        require(self.binary is not None, "sshd is not installed (openssh-server)")
        self.sftp_server = next((p for p in SFTP_SERVERS if os.access(p, os.X_OK)), None)
        require(self.sftp_server is not None, "sftp-server is not installed (openssh-server / openssh-sftp-server)")
        require(shutil.which("ssh-keygen") is not None, "ssh-keygen is not installed (openssh-client)")

    @property
    def sftp_log(self) -> Path:
        return self.dir / "sftp.log"

    def new_host_key(self) -> None:
        for old in self.dir.glob("host_key*"):
            old.unlink()
        keygen(self.dir / "host_key")

    def start(self) -> Sshd:
        if not (self.dir / "host_key").exists():
            self.new_host_key()
        if os.geteuid() == 0:
            # sshd started as root wants its privilege-separation directory, which the
            # package's service makes at boot (tmpfs /run); a test machine may not have it yet.
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        config = self.dir / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {self.dir / 'host_key'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}", "PidFile none", "StrictModes no", "UsePAM no",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            "LogLevel INFO",
            # the subsystem runs through the user's shell: its log goes to a file of ours
            f"Subsystem sftp {self.sftp_server} -l INFO -e 2>>{self.sftp_log}", *self.extra, ""]))
        log = open(self.dir / "sshd.log", "ab")
        self.proc = subprocess.Popen([self.binary, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
        log.close()
        wait_for(self._answers, 20, f"sshd on port {self.port}", alive=[self.proc],
                 detail=lambda: (self.dir / "sshd.log").read_text(errors="replace")[-2000:])
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=scaled(5)) as conn:
                return conn.recv(64).startswith(b"SSH-2.0-")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=scaled(20))
        self.proc = None

    def kill_sessions(self) -> int:
        """SIGKILL to this sshd's connection processes (the link drops mid-copy); how many."""
        children = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
            except (OSError, StopIteration):
                continue
            if int(ppid.split()[1]) == self.proc.pid:
                children.append(int(status.parent.name))
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        return len(children)

    def closes(self, path: Path | str, *, forced: bool = True) -> list[dict]:
        """The SFTP server's closes of `path`, oldest first: {"read", "written", "forced"}; with
        forced=False only those the client asked for (a killed client's session logs a forced
        close at exit, or nothing when the closed pipe kills it first)."""
        if not self.sftp_log.exists():
            return []
        return [{"read": int(m["read"]), "written": int(m["written"]), "forced": bool(m.group(1))}
                for m in CLOSED.finditer(self.sftp_log.read_text(errors="replace"))
                if m["path"] == str(path) and (forced or not m.group(1))]

    def written(self) -> int:
        """Bytes the SFTP server has written to any file so far."""
        if not self.sftp_log.exists():
            return 0
        return sum(int(m["written"]) for m in CLOSED.finditer(self.sftp_log.read_text(errors="replace")))
