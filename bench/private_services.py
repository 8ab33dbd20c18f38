"""Throw-away PostgreSQL and Redis servers for bench/faults.py: the drill restarts and stops
them, so it must not be the machine's shared ones that other tests and agents are using.

  PrivatePostgres  `initdb` into a temp dir (Debian's binaries under
                   /usr/lib/postgresql/<ver>/bin), `pg_ctl start/restart/stop` on a free
                   loopback port with its socket in that dir. initdb refuses root, so as root
                   every PostgreSQL command runs as the `postgres` user (`runuser`).
  PrivateRedis     `redis-server --daemonize yes` on a free port with its dir, pid file and
                   log in a temp dir; `shutdown nosave` and the same command to start again.

Both are torn down by `stop()` (idempotent: the caller's finally and atexit both call it),
and a watchdog process outlives a SIGKILLed caller long enough to kill the servers and remove
their dirs, so nothing is left listening whatever happens to the drill.

    python bench/private_services.py --watch <pid> <dir>...   # the watchdog (internal)
"""
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PG_USER = "postgres"


def free_port() -> int:
    """A loopback port nobody listens on now (the kernel's pick; closed again at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bindir() -> str | None:
    """Where initdb and pg_ctl live: Debian keeps them off PATH, one dir per major version
    (the newest wins); PATH is the fallback for other layouts."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if versions:
        return str(Path(versions[-1]).parent)
    initdb = shutil.which("initdb")
    return str(Path(initdb).resolve().parent) if initdb else None


def _wait(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def _kill_from_pidfile(pidfile: Path, sig: int) -> None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, sig)
    except (OSError, ValueError, IndexError):
        pass


class PrivatePostgres:
    """A PostgreSQL cluster of its own, trust auth for `postgres` on 127.0.0.1:<port>."""

    def __init__(self, *options: str):
        """`options`: more server settings on every start (e.g.
        shared_preload_libraries=pg_stat_statements)."""
        self.options = "".join(f" -c {option}" for option in options)
        self.bindir = postgres_bindir()
        if self.bindir is None:
            raise SystemExit("initdb not found (Debian: apt-get install postgresql)")
        self.version = Path(self.bindir).parent.name
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="bench-faults-pg-"))
        self.data, self.log = self.root / "data", self.root / "postgres.log"
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb: "cannot be run as root"
            user = pwd.getpwnam(PG_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", PG_USER, "--"]
        self.url = f"postgres://{PG_USER}@127.0.0.1:{self.port}/postgres"
        self.stopped = False

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
        return result

    def _pg_ctl(self, action: str, *extra: str) -> None:
        # The server options on every start and restart: loopback only, the socket in our dir.
        self._run(f"{self.bindir}/pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1{self.options}", *extra, action)

    def start(self) -> "PrivatePostgres":
        self._run(f"{self.bindir}/initdb", "-D", str(self.data), "-U", PG_USER, "-A", "trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        self._pg_ctl("start")
        return self

    def restart(self) -> None:
        """What the drill does to the database: a fast-mode restart, as `pg_ctlcluster
        restart` does (active connections are terminated, the server is away meanwhile)."""
        self._pg_ctl("restart", "-m", "fast")

    def ready(self) -> bool:
        return subprocess.run([f"{self.bindir}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-q"]
                              ).returncode == 0

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.data.exists():
            try:
                self._run(f"{self.bindir}/pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop",
                          timeout=60)
            except (subprocess.SubprocessError, OSError, RuntimeError):
                _kill_from_pidfile(self.data / "postmaster.pid", signal.SIGQUIT)  # immediate shutdown
                _wait(lambda: not (self.data / "postmaster.pid").exists(), 10)
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A Redis server of its own on 127.0.0.1:<port>: nothing persisted (like CI's), or with
    `append_only` an append-only file fsynced every second, as docker-compose.yml runs it."""

    def __init__(self, append_only: bool = False):
        if shutil.which("redis-server") is None:
            raise SystemExit("redis-server not found (Debian: apt-get install redis-server)")
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="bench-faults-redis-"))
        self.pidfile = self.root / "redis.pid"
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--daemonize", "yes",
                        "--dir", str(self.root), "--pidfile", str(self.pidfile), "--logfile",
                        str(self.root / "redis.log"), "--save", "", "--appendonly", "yes" if append_only else "no"]
        self.stopped = False

    def start(self) -> "PrivateRedis":
        subprocess.run(self.command, check=True, timeout=30)
        if not _wait(self.ready, 15):
            raise SystemExit(f"the private redis-server on port {self.port} did not answer")
        return self

    def ready(self) -> bool:
        return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "ping"], capture_output=True,
                              text=True).stdout.strip() == "PONG"

    def shutdown(self) -> None:
        subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "shutdown", "nosave"],
                       capture_output=True, timeout=30)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.shutdown()
        if not _wait(lambda: not self.pidfile.exists(), 5):
            _kill_from_pidfile(self.pidfile, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def on_services(use_system_services: bool, run, *postgres_options: str) -> None:
    """run(database_url, redis_url) on the servers DATABASE_URL and REDIS_URL name, or on a
    private PostgreSQL and Redis configured as production runs them (docker-compose.yml:
    PostgreSQL's defaults, autovacuum among them, which a CI machine's may turn off; Redis
    with its append-only file; `postgres_options` as more server settings), stopped and
    removed after."""
    if use_system_services:
        url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
        if not url.startswith(("postgres://", "postgresql://")) or not redis_url:
            raise SystemExit("--use-system-services: set DATABASE_URL (a PostgreSQL server) and REDIS_URL, e.g.\n"
                             "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres "
                             "REDIS_URL=redis://127.0.0.1:6379/13")
        run(url, redis_url)
        return
    postgres, redis = PrivatePostgres(*postgres_options), PrivateRedis(append_only=True)
    watchdog = start_watchdog([postgres.root, redis.root])
    try:
        postgres.start()
        redis.start()
        run(postgres.url, redis.url)
    finally:
        postgres.stop()
        redis.stop()
        watchdog.terminate()
        print("the bench's PostgreSQL and Redis stopped and removed")


def start_watchdog(dirs: list[Path]) -> subprocess.Popen:
    """A process in its own session that tears the servers down if this one dies without
    doing it (SIGKILL, a test runner's timeout): it outlives us by design."""
    return subprocess.Popen([sys.executable, __file__, "--watch", str(os.getpid()), *map(str, dirs)],
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _watch(parent: int, dirs: list[Path]) -> None:
    while True:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(1)
    for root in dirs:  # whatever is still there: the caller did not clean up
        _kill_from_pidfile(root / "data" / "postmaster.pid", signal.SIGQUIT)
        _kill_from_pidfile(root / "redis.pid", signal.SIGKILL)
    time.sleep(2)
    for root in dirs:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--watch"]:
    _watch(int(sys.argv[2]), [Path(d) for d in sys.argv[3:]])
