"""The store outlives its database machine (docs/operations/high-availability.md, ADR 0007):

- point-in-time recovery with pgBackRest: WAL archived continuously from a cluster of its
  own; payments credited, the time noted, more credited; a restore to that time into a fresh
  data directory holds exactly the ledger of that moment;
- a synchronous standby with automatic failover (Patroni on etcd): the storefront's writers
  credit payments and run the lifecycle through a multi-host DATABASE_URL while the primary's
  machine is killed (SIGKILL); the standby takes over, the writers reconnect by themselves,
  and no committed ledger row is lost or doubled, no renewal missing or doubled, no notice
  sent twice.

Each test brings its own servers on free loopback ports (tests/ha/cluster.py) and drives the
storefront in a process of its own (tests/ha/driver.py). Both print their figures."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.deadlines import scaled, wait_for
from tests.ha import cluster
from tests.ha.cluster import Etcd, PatroniNode, PgBackRest, Postgres, psql
from tests.tools import require, require_tool

pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("ha")]
REPO = Path(__file__).resolve().parents[2]


def tools() -> None:
    require(cluster.bindir() is not None, "PostgreSQL's server (initdb) is not installed (apt-get install postgresql)")
    for tool in ("pgbackrest", "patroni", "etcd", "setpriv"):
        require_tool(tool, "scripts/install-test-tools.sh installs it")


def storefront_env(url: str, var: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "PYTEST_XDIST_WORKER"}}
    (var / "mail").mkdir(parents=True, exist_ok=True)
    return {**env, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "VAR_DIR": str(var),
            "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend", "EMAIL_FILE_PATH": str(var / "mail"),
            "DB_CONN_MAX_AGE": "60", "DB_CONNECT_TIMEOUT_SECONDS": "2", "LOG_LEVEL": "ERROR"}


def storefront(env: dict, *args: str, timeout: float = 120) -> str:
    result = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=scaled(timeout))
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def schema(tmp_path_factory):
    """The storefront's migrated schema, dumped once (pg_dump -Fc) for both tests' clusters:
    a restore takes a second where `migrate` takes ten."""
    tools()
    root = cluster.owned_tempdir("ha-schema-")
    pg = Postgres(root).initdb().start()
    try:
        psql(pg.port, "CREATE DATABASE store")
        storefront(storefront_env(pg.url, tmp_path_factory.mktemp("migrate")), "manage.py", "migrate", "-v0", "--skip-checks",
                   timeout=300)
        dump = tmp_path_factory.mktemp("schema") / "store.dump"
        cluster.run("pg_dump", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-Fc", "-f", str(dump),
                    "store", server=False)
        yield dump
    finally:
        pg.stop()
        cluster.remove(root)


class Clock:
    """Prints how long each phase took (a test's figures, and where its seconds go)."""

    def __init__(self):
        self.start = self.last = time.monotonic()

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        print(f"  {now - self.start:6.1f} s (+{now - self.last:5.1f}) {what}", flush=True)
        self.last = now


def load(port: int, dump: Path) -> None:
    psql(port, "CREATE DATABASE store")
    cluster.run("pg_restore", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "store", "--no-owner",
                str(dump), server=False)


def test_a_restore_to_a_point_in_time_holds_the_ledger_of_that_moment(schema, tmp_path):
    root = cluster.owned_tempdir("ha-pitr-")
    pg = Postgres(root)
    backrest = PgBackRest(root, pg)
    restored, clock = Postgres(root, "restored"), Clock()
    try:
        print()
        pg.initdb().start("archive_mode=on", backrest.archive_command(), "wal_level=replica",
                          "archive_timeout=60")
        load(pg.port, schema)
        clock("a cluster archiving to pgBackRest, the schema loaded")
        backrest("stanza-create")
        backrest("backup", "--type=full", timeout=180)
        clock("a full backup")

        wrote = json.loads(storefront(storefront_env(pg.url, tmp_path), "-m", "tests.ha.driver", "pay-around", "6", "5"))
        before, target = wrote["before"], wrote["target"]  # the ledger as it was at `target`
        assert len(before) == 6 and len(wrote["after"]) == 11 and wrote["after"][:6] == before
        clock("6 payments credited, the time noted, 5 more credited")
        written = time.monotonic()
        backrest("check")  # switches the WAL segment and waits until it is archived
        archived = time.monotonic() - written
        clock("the last WAL segment archived")

        started = time.monotonic()
        backrest("restore", f"--pg1-path={restored.data}", "--type=time", f"--target={target}",
                 "--target-action=promote", timeout=300)
        restored.start("archive_mode=off")
        wait_for(lambda: psql(restored.port, "SELECT pg_is_in_recovery()") == "f", 60,
                 "the restored cluster to finish recovery and promote", ignore=(AssertionError,))
        took = time.monotonic() - started
        clock("restored to the time into a fresh data directory, recovered and promoted")
        size = int(psql(restored.port, "SELECT pg_database_size('store')"))
        at_target = psql(restored.port, cluster.LEDGER_SQL, db="store").splitlines()
        print(f"\npoint-in-time recovery: target {target}; WAL archived {archived:.1f} s after the last write "
              f"(archive_timeout bounds the recovery point in production); restore of a "
              f"{size / 2**20:.0f} MiB database to the target took {took:.1f} s")
        assert at_target == before, "the restored ledger is not the ledger at the target time"
        clock("the restored ledger read and compared")
    finally:
        restored.stop()
        pg.stop()
        cluster.remove(root)
        clock("both clusters stopped and removed")


#: Patroni's timers: the leader key lives `ttl` s unless renewed every `loop_wait` s; a
#: standby takes over once it has expired. Production keeps Patroni's defaults (30/10/10).
TIMING = {"ttl": 10, "loop_wait": 1, "retry_timeout": 3}


def progress(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def test_the_standby_takes_over_when_the_primary_dies_and_nothing_is_lost_or_doubled(schema, tmp_path):
    root = cluster.owned_tempdir("ha-patroni-")
    etcd, nodes, writer, clock = None, [], None, Clock()
    try:
        print()
        etcd = Etcd(root)
        clock("etcd up")
        first = PatroniNode(root, "node1", etcd, TIMING)
        nodes.append(first)
        wait_for(lambda: first.role_is("primary"), 90, "node1 to bootstrap as the primary", alive=[first.proc],
                 detail=first.log_tail)
        clock("node1 bootstrapped, the primary")
        second = PatroniNode(root, "node2", etcd, TIMING)
        nodes.append(second)
        load(first.port, schema)
        wait_for(lambda: second.role_is("sync"), 90, "node2 to stream as the synchronous standby",
                 alive=[second.proc], detail=second.log_tail)
        clock("schema loaded; node2 the synchronous standby")

        url = f"postgres://postgres@127.0.0.1:{first.port},127.0.0.1:{second.port}/store?target_session_attrs=read-write"
        stop, log = tmp_path / "stop", tmp_path / "progress.jsonl"
        errors = tmp_path / "writer.err"
        writer = subprocess.Popen([sys.executable, "-m", "tests.ha.driver", "writer", str(stop), str(log)], cwd=REPO,
                                  env=storefront_env(url, tmp_path), stdout=subprocess.PIPE,
                                  stderr=errors.open("w"), text=True)

        def writer_log() -> str:
            return errors.read_text(errors="replace")[-3000:]

        wait_for(lambda: sum("ok" in e for e in progress(log)) >= 15, 120, "the writer's first 15 payments",
                 alive=[writer], detail=writer_log)
        clock("the writer seeded its leases and credited 15 payments")

        killed = time.time()
        # the primary now (node1, unless a loaded machine already moved the leader key)
        primary, standby = (first, second) if first.role_is("primary") else (second, first)
        primary.kill()
        wait_for(lambda: standby.role_is("primary"), 60, f"{standby.name} to take over as the primary",
                 detail=standby.log_tail)
        promoted = time.time()
        clock(f"{primary.name} killed, {standby.name} promoted")
        wait_for(lambda: sum(e.get("t", 0) > promoted and "ok" in e for e in progress(log)) >= 15, 60,
                 "15 payments credited after the failover", alive=[writer], detail=writer_log)
        clock("15 payments credited after the failover")
        stop.touch()
        out, _ = writer.communicate(timeout=scaled(120))
        assert writer.returncode == 0, writer_log()
        result = json.loads(out.strip().splitlines()[-1])
        (tmp_path / "report.json").write_text(json.dumps(result, indent=1))  # kept by pytest, for a failure
        clock("the writer's last lifecycle pass and report")
        events = progress(log)
        back = min(e["t"] for e in events if "ok" in e and e["t"] > killed)
        print(f"\nfailover: primary {primary.name} SIGKILLed; {standby.name} promoted after {promoted - killed:.1f} s (Patroni ttl "
              f"{TIMING['ttl']} s); the first payment credited again {back - killed:.1f} s after the kill; "
              f"{result['errors']} passes failed meanwhile and were redone; {len(result['ok'])} payments, "
              f"{result['lifecycle_ok']} lifecycle passes")

        # the writer reconnected by itself and wrote on
        assert sum(e["t"] > promoted for e in events if "ok" in e) >= 15
        # every payment whose pass reported success is credited once; none is credited twice
        assert set(result["made"][:-1]) <= set(result["ok"])  # a failed pass is redone until it succeeds
        credits = {int(k): v for k, v in result["credits"].items()}
        assert all(credits.get(i) == 1 for i in result["ok"]), {i: credits.get(i) for i in result["ok"]}
        assert all(v == 1 for v in credits.values()), credits
        # leases: the covered ones renewed exactly once (a week further, one charge), the others suspended once
        renewed = [lease for lease in result["leases"].values() if lease["renewals_paid"]]
        suspended = [lease for lease in result["leases"].values() if not lease["renewals_paid"]]
        assert len(renewed) == len(suspended) == 4, result["leases"]
        for lease in renewed:
            assert (lease["state"], lease["renewed_by_days"], lease["renewal_invoices"], lease["renewal_charges"],
                    lease["suspended_events"]) == ("active", 7.0, 1, 1, 0), lease
        for lease in suspended:
            assert (lease["state"], lease["renewed_by_days"], lease["renewal_invoices"], lease["renewal_charges"],
                    lease["suspended_events"]) == ("suspended", 0.0, 1, 0, 1), lease
        # no notice twice: neither in the outbox nor by e-mail
        for lease in result["leases"].values():
            assert len(lease["notices"]) == len(set(lease["notices"])), lease["notices"]
        # each outbox row is mailed at most once (a reminder 3 days and one 1 day ahead can read alike)
        outbox = Counter(map(tuple, result["outbox"]))

        def notice_of(to: str, subject: str, body: str) -> tuple:  # a mail's body is the notice's and a footer
            return next((key for key in outbox if key[:2] == (to, subject) and body.startswith(key[2])), None)

        mailed = Counter(notice_of(*mail) for mail in result["mails"])
        assert None not in mailed, "a mail that is no outbox notice"
        twice = {notice: n for notice, n in mailed.items() if n > outbox[notice]}
        assert not twice, twice
        # mails went out (28 notices: two reminders and a renewal notice per lease, 4 suspensions); one
        # whose batch's commit answer the kill took is not mailed (mail follows a commit seen to succeed)
        assert sum(mailed.values()) >= 16
    finally:
        if writer and writer.poll() is None:
            writer.kill()
            writer.wait(30)
        for node in nodes:
            node.stop()
        if etcd:
            etcd.stop()
        cluster.remove(root)
