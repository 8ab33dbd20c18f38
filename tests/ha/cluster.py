"""Throwaway PostgreSQL clusters for the recovery and failover tests, on Debian's packages:
a plain cluster (initdb), one that archives its WAL to a pgBackRest repository, and a
Patroni cluster of two nodes on a one-member etcd. Each lives in a temp dir of its own on
free loopback ports, so the machine's PostgreSQL and every other test never notice.

PostgreSQL refuses to run as root: as root every server process runs as the `postgres`
user through `setpriv`, which execs (no fork in between, unlike runuser), so a Popen's pid
is the server's own and a SIGKILL reaches it."""
from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from tests.deadlines import scaled, wait_for

PG_USER = "postgres"

#: The ledger, one "|"-joined line per entry (NULL as ""), as psql -At prints it: read the
#: same way from the storefront's connection and from a restored cluster.
LEDGER_SQL = ("SELECT concat_ws('|', e.id, u.username, e.kind, e.amount_cents, e.balance_after_cents, "
              "coalesce(e.invoice_id::text, ''), coalesce(e.idempotency_key, '')) FROM billing_ledgerentry e "
              "JOIN billing_account a ON a.id = e.account_id JOIN auth_user u ON u.id = a.customer_id ORDER BY e.id")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bindir() -> str | None:
    """Debian keeps initdb and pg_ctl off PATH, one dir per major version (the newest wins)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return str(Path(found[-1]).parent) if found else None


def as_pg_user() -> list[str]:
    """The prefix that runs a command as the `postgres` user when we are root (exec, no fork)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={PG_USER}", f"--regid={PG_USER}", "--init-groups", "--reset-env", "--"]


def owned_tempdir(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        user = pwd.getpwnam(PG_USER)
        os.chown(root, user.pw_uid, user.pw_gid)
    return root


def run(*args: str, timeout: float = 120, server: bool = True) -> str:
    """Run a PostgreSQL tool; `server` ones (initdb, pg_ctl, pgbackrest) as the postgres user."""
    result = subprocess.run([*(as_pg_user() if server else []), *args], capture_output=True, text=True,
                            timeout=scaled(timeout), cwd="/")
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout[-2000:]}"
                             f"\n{result.stderr[-3000:]}")
    return result.stdout


def psql(port: int, sql: str, db: str = "postgres") -> str:
    return run("psql", "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, "-d", db, "-XAtq",
               "-v", "ON_ERROR_STOP=1", "-c", sql, timeout=60, server=False).strip()


def kill_pidfile(data: Path, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(int((data / "postmaster.pid").read_text().split()[0]), sig)
    except (OSError, ValueError, IndexError):
        pass


class Postgres:
    """A cluster in `root/name`: initdb, pg_ctl start/stop, trust auth on 127.0.0.1:port."""

    def __init__(self, root: Path, name: str = "data", port: int | None = None):
        self.bin = bindir()
        self.root, self.data = root, root / name
        self.port = port or free_port()
        self.log = root / f"{name}.log"

    @property
    def url(self) -> str:
        return f"postgres://{PG_USER}@127.0.0.1:{self.port}/store"

    def initdb(self) -> Postgres:
        run(f"{self.bin}/initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", "-E", "UTF8", "--locale=C",
            "--no-sync")
        return self

    def start(self, *settings: str) -> Postgres:
        options = " ".join([f"-p {self.port}", f"-k {self.root}", "-c listen_addresses=127.0.0.1", "-c fsync=off",
                            *(f"-c {s}" for s in settings)])
        run(f"{self.bin}/pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(scaled(60))),
            "-o", options, "start", timeout=90)
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                run(f"{self.bin}/pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
            except (AssertionError, subprocess.SubprocessError):
                kill_pidfile(self.data)


class PgBackRest:
    """A pgBackRest stanza `store` whose repository is a directory beside the cluster."""

    STANZA = "store"

    def __init__(self, root: Path, pg: Postgres):
        self.config = root / "pgbackrest.conf"
        self.repo = root / "repo"
        self.config.write_text("\n".join([
            "[global]", f"repo1-path={self.repo}", "repo1-retention-full=2", f"lock-path={root / 'lock'}",
            f"log-path={root / 'log'}", f"spool-path={root / 'spool'}", "log-level-console=warn",
            "log-level-file=info", "start-fast=y", "archive-async=n", "compress-type=lz4", "",
            f"[{self.STANZA}]", f"pg1-path={pg.data}", f"pg1-port={pg.port}", f"pg1-socket-path={root}",
            f"pg1-user={PG_USER}", ""]))
        os.chmod(self.config, 0o644)

    def archive_command(self) -> str:
        return f"archive_command='pgbackrest --config={self.config} --stanza={self.STANZA} archive-push %p'"

    def __call__(self, *args: str, timeout: float = 120) -> str:
        return run("pgbackrest", f"--config={self.config}", f"--stanza={self.STANZA}", *args, timeout=timeout)


# --- Patroni on etcd ------------------------------------------------------------------------

def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


class Etcd:
    def __init__(self, root: Path):
        self.client, self.peer = free_port(), free_port()
        self.log = open(root / "etcd.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*as_pg_user(), "etcd", "--name", "e1", "--data-dir", str(root / "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{self.client}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.client}",
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-cluster", f"e1=http://127.0.0.1:{self.peer}", "--unsafe-no-fsync"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
        wait_for(lambda: http_status(f"http://127.0.0.1:{self.client}/health") == 200, 30, "etcd to answer",
                 alive=[self.proc], detail=lambda: (root / "etcd.log").read_text()[-2000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()


class PatroniNode:
    """One Patroni-managed PostgreSQL: its REST API says whether it is the primary
    (`/primary` answers 200) or the synchronous standby (`/sync`)."""

    def __init__(self, root: Path, name: str, etcd: Etcd, timing: dict):
        self.root, self.name = root, name
        self.port, self.api = free_port(), free_port()
        self.data = root / name
        self.config = root / f"{name}.yml"
        config = {
            "scope": "store", "name": name,
            "restapi": {"listen": f"127.0.0.1:{self.api}", "connect_address": f"127.0.0.1:{self.api}"},
            "etcd3": {"hosts": f"127.0.0.1:{etcd.client}"},
            "bootstrap": {
                "dcs": {**timing, "maximum_lag_on_failover": 0, "synchronous_mode": True,
                        "postgresql": {"use_pg_rewind": False, "parameters": {
                            "wal_level": "replica", "hot_standby": "on", "max_wal_senders": 5,
                            "max_replication_slots": 5, "wal_keep_size": "64MB"}}},
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}", "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data), "bin_dir": bindir(), "pgpass": str(root / f"{name}.pgpass"),
                "authentication": {"superuser": {"username": PG_USER}, "replication": {"username": PG_USER}},
                "parameters": {"unix_socket_directories": str(root), "fsync": "off"},
                "basebackup": [{"checkpoint": "fast"}],  # not a spread checkpoint of minutes
            },
            "log": {"level": "WARNING"},
        }
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.log = open(root / f"{name}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen([*as_pg_user(), "patroni", str(self.config)], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd="/")

    def role_is(self, role: str) -> bool:
        return http_status(f"http://127.0.0.1:{self.api}/{role}") == 200

    def log_tail(self) -> str:
        self.log.flush()
        return f"{self.name}: " + (self.root / f"{self.name}.log").read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """The machine is gone: Patroni, the postmaster and every backend, SIGKILL at once."""
        pids = [self.proc.pid]
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
            pids.append(postmaster)
            pids += [int(p) for p in subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                                    text=True).stdout.split()]
        except (OSError, ValueError, IndexError):
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        kill_pidfile(self.data)
        self.log.close()


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
