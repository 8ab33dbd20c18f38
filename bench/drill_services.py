"""The servers a fault drill (bench/faults.py) restarts and stops: by default its own
PostgreSQL and Redis (PrivateServices, on free loopback ports, removed at the end), or with
--use-system-services the machine's (SystemServices, left running at the end); and the
signal handling that makes SIGTERM/SIGHUP tear down like Ctrl-C."""
import atexit
import os
import shutil
import signal
import subprocess
import time

from private_services import PrivatePostgres, PrivateRedis, start_watchdog

PG_VERSION = sorted(os.listdir("/etc/postgresql"))[0] if os.path.isdir("/etc/postgresql") else "15"
REDIS_START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
               "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]

class SystemServices:
    """--use-system-services: the machine's own PostgreSQL cluster (`pg_ctlcluster`) and its
    Redis on 6379, as DATABASE_URL and REDIS_URL name them. Everything else on the machine
    sees them go away: for an operator's box, never next to other tests."""

    label = "the machine's own PostgreSQL and Redis"

    def __init__(self, database_url: str, redis_url: str):
        if not database_url.startswith(("postgres://", "postgresql://")) or not redis_url:
            raise SystemExit("--use-system-services: set DATABASE_URL (PostgreSQL server) and REDIS_URL, e.g.\n"
                             "  DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres "
                             "REDIS_URL=redis://127.0.0.1:6379/13")
        if shutil.which("pg_ctlcluster") is None:
            raise SystemExit("pg_ctlcluster not found: --use-system-services restarts the local Debian cluster")
        self.database_url, self.redis_url = database_url, redis_url
        self.restart_command = f"pg_ctlcluster {PG_VERSION} main restart"

    def pg_restart(self) -> None:
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, "main", "restart"], check=True,
                       timeout=120)

    def pg_ready(self) -> bool:
        return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]).returncode == 0

    def redis_ready(self) -> bool:
        return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"], capture_output=True,
                              text=True).stdout.strip() == "PONG"

    def redis_stop(self) -> None:
        subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "shutdown", "nosave"], capture_output=True)

    def redis_start(self) -> None:
        subprocess.run(REDIS_START, check=True)

    def close(self) -> str:
        """Both are always left running, whatever happened."""
        if not self.pg_ready():
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, "main", "start"], check=False)
        if not self.redis_ready():
            os.makedirs("/var/lib/redis", exist_ok=True)
            os.makedirs("/var/log/redis", exist_ok=True)
            subprocess.run(REDIS_START, check=False)
        for _ in range(60):
            if self.pg_ready() and self.redis_ready():
                break
            time.sleep(0.5)
        else:
            print("!! PostgreSQL or Redis did not come back: start them by hand", flush=True)
        return f"PostgreSQL {'up' if self.pg_ready() else 'DOWN'}, Redis {'up' if self.redis_ready() else 'DOWN'}"


class PrivateServices:
    """The default: a PostgreSQL cluster and a Redis server of the drill's own, on free
    ports, removed at the end (bench/private_services.py), so nothing else is disturbed."""

    def __init__(self):
        self.postgres, self.redis = PrivatePostgres(), PrivateRedis()
        self.watchdog = start_watchdog([self.postgres.root, self.redis.root])
        atexit.register(self.close)
        self.postgres.start()
        self.redis.start()
        self.database_url, self.redis_url = self.postgres.url, self.redis.url
        self.label = (f"private PostgreSQL {self.postgres.version} on 127.0.0.1:{self.postgres.port} and "
                      f"Redis on 127.0.0.1:{self.redis.port}")
        self.restart_command = "pg_ctl restart -m fast"

    def pg_restart(self) -> None:
        self.postgres.restart()

    def pg_ready(self) -> bool:
        return self.postgres.ready()

    def redis_ready(self) -> bool:
        return self.redis.ready()

    def redis_stop(self) -> None:
        self.redis.shutdown()

    def redis_start(self) -> None:
        subprocess.run(self.redis.command, check=True)

    def close(self) -> str:
        self.postgres.stop()
        self.redis.stop()
        if self.watchdog.poll() is None:
            self.watchdog.terminate()
            self.watchdog.wait(5)
        return "private PostgreSQL and Redis stopped and removed"


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP end the script like Ctrl-C does: through the finally blocks and
    atexit, which stop gunicorn, Celery and the servers (a second signal cannot cut that
    teardown short)."""
    def handler(signum, _frame):
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
