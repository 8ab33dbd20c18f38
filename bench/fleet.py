"""How many nodes can one storefront serve?

Starts its own PostgreSQL and Redis configured as docker-compose.yml runs them (PostgreSQL's
defaults, autovacuum among them; Redis with its append-only file), or with
--use-system-services uses the servers DATABASE_URL and REDIS_URL name as they are (a CI
machine's PostgreSQL may run without autovacuum, which a long run then does not pay for).
Creates a throwaway database there (bench_fleet_<pid>, dropped at the end), migrates it,
loads the demo catalog, and for each size N enrols N simulated nodes straight into the
database — real Ed25519 keys, real hashed credentials, 8 GPU slots each, two running leases
per node — then starts the web server as production does (scripts/start.sh web: granian,
DEBUG=0, NodeAgentDriver, Redis cache) and drives the real endpoints at the poll rate: every node, at its own offset in
the interval, GETs /agent/v1/desired (with the ETag of its last answer, as the agent does)
and POSTs a report signed over its raw bytes with an increasing seq (8 GPUs, 2 instances
with growing egress). The load generator (asyncio and bench/rawhttp.py's keep-alive client, one
process) measures itself.

Per size it prints the request rate asked and sustained, p50/p99 of both endpoints, errors,
the rows written and the queries per poll (measured in-process on the same database), the
bare Django view's rate on the same server (wrk) and the ratio, and one line that scripts
read:

    fleet: N nodes at S s poll: R req/s, p99 desired D ms, p99 report P ms

At the largest size it prints EXPLAIN of every query a poll and a report make. Through the
counted window a sampler reads /proc every 2 s; the median 5 s slice and the three slowest are
printed with the CPU each kind of process took meanwhile (bench/timeline.py; --timeline
writes every slice), so a slow stretch comes with what was running.

    .venv/bin/python bench/fleet.py                     # 100, 1,000, 10,000 nodes, 15 s poll, 30 s each
    .venv/bin/python bench/fleet.py 10000 --poll 15 --duration 120 --settle 180    # the issue's fleet
    .venv/bin/python bench/fleet.py --smoke             # seconds: 20 nodes (CI, tests/bench)
    .venv/bin/python bench/fleet.py 3000 --poll 1.5 --workers 1 --hosts 2   # two storefront hosts, one database
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python bench/fleet.py 1000 --use-system-services

The simulated nodes and their reports are bench/fleet_nodes.py, the load generator
bench/fleet_load.py; here the runs, the servers they drive, the per-poll costs and the report.
"""
import argparse
import asyncio
import base64
import functools
import os
import re
import resource
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE), str(BASE / "bench")]

from fleet_load import drive, warm  # noqa: E402
from fleet_nodes import (  # noqa: E402
    FLEET_POLL,
    LEASES_PER_NODE,
    TELEMETRY_EVERY,
    TELEMETRY_MINUTES,
    compressed_timers,
    enrol_fleet,
    report_body,
)
from load import Granian, Gunicorn, manage, production_env, run_wrk, wait_http, with_db  # noqa: E402
from private_services import on_services  # noqa: E402
from timeline import Sampler, percentile, report, write_tsv  # noqa: E402

SETTLE_POLLS = 6      # untimed polls on the timed run's connections: a worker has then met all
                      # but (1/2)^6 of the nodes (2 workers)
SMALL_TABLE_ROWS = 100   # a sequential scan of a table under this is the planner's right choice, not a defect


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, help="nodes per run (default 100 1000 10000)")
    parser.add_argument("--poll", type=float, default=15.0, help="seconds between a node's polls (NODE_POLL_SECONDS)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load per size")
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="web workers (scripts/start.sh WEB_CONCURRENCY; default: production's, one per CPU)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads per worker (scripts/start.sh WEB_THREADS; default: production's, 2)")
    parser.add_argument("--worker-class", choices=("sync", "gthread"), default=None,
                        help="gunicorn's worker (default: gthread when --threads > 1, else sync)")
    parser.add_argument("--server", choices=("granian", "gunicorn"), default="granian",
                        help="granian: production's web server started as production starts it (scripts/start.sh "
                             "web); gunicorn: the server production ran before granian (docs/adr/0019), to compare (the bench extra)")
    parser.add_argument("--connections", type=int, default=64, help="the generator's open connections")
    parser.add_argument("--protocol", choices=("report", "get"), default="report",
                        help="report: the agent as it polls now, whose signed report is answered with the "
                             "desired state (one request per poll; 'desired' latencies are those answers); "
                             "get: an older agent, GET /agent/v1/desired (with its ETag) then the report")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="time each node's first (cold) round too: a fleet that just enrolled")
    parser.add_argument("--settle", type=float, default=None,
                        help="seconds of polling before the counted window (default: 6 polls)")
    parser.add_argument("--use-system-services", action="store_true",
                        help="the PostgreSQL and Redis that DATABASE_URL and REDIS_URL name, as they are configured "
                             "(default: the bench's own, configured as docker-compose.yml runs them)")
    parser.add_argument("--timeline", metavar="TSV", help="write every 5 s slice of the counted window: the "
                                                            "latencies and the CPU of each kind of process")
    parser.add_argument("--hosts", type=int, default=1,
                        help="storefront hosts: web servers of --workers each on ports of their own, the nodes "
                             "spread over them in turn, all on the one database and Redis "
                             "(docs/operations/high-availability.md, two storefront hosts)")
    parser.add_argument("--telemetry", choices=("off", "on", "both"), default="off",
                        help=f"GPU telemetry in the reports (nodeagent/PROTOCOL.md): {TELEMETRY_MINUTES} minutes of 8 cards every "
                             f"{TELEMETRY_EVERY}th report, as the agent sends it at a 15 s poll; both: each size "
                             "runs without, then with, on the same server, and prints the ratio")
    parser.add_argument("--smoke", action="store_true", help="20 nodes, 2 s poll, 4 s: checks it runs (CI)")
    args = parser.parse_args()
    args.sizes = tuple(args.sizes) or (100, 1_000, 10_000)
    if args.smoke:
        args.sizes, args.poll, args.duration, args.workers, args.connections = (20,), 2.0, 4.0, 1, 8
        args.settle = 1.0
    return args


# --- what a poll costs, measured in-process on the same database -------------------------------

def per_poll_costs(fleet: list[dict], explain: bool) -> dict:
    """Queries and rows written by a desired poll (the full document, and the steady one an
    agent holding the ETag makes) and by a steady report (with `desired_etag`, answered with
    the desired state), through Django's test client on the same database (the served path,
    minus the network); then the CPU per request."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    node = fleet[len(fleet) // 2]
    auth = {"HTTP_AUTHORIZATION": f"Node {node['credential']}"}
    client, out, captured = Client(HTTP_HOST="127.0.0.1"), {}, {}
    key = Ed25519PrivateKey.from_private_bytes(node["key"])

    def post(body: bytes):
        return client.post("/agent/v1/report", body, content_type="application/json",
                           HTTP_X_NODE_SIGNATURE=base64.b64encode(key.sign(body)).decode(), **auth)

    client.get("/agent/v1/desired", **auth)          # the first poll issues the ops
    with CaptureQueriesContext(connection) as q:
        first = client.get("/agent/v1/desired", **auth)
    captured["desired (document)"] = [x["sql"] for x in q.captured_queries]
    document, etag = first.json(), first["ETag"]
    ops = {i["lease_id"]: i["op_id"] for i in document["instances"]}
    post(report_body(node, 10**9, ops, 1000, desired_etag=etag))   # the first report stores the facts
    with CaptureQueriesContext(connection) as q:
        assert client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **auth).status_code == 304
    captured["desired (304)"] = [x["sql"] for x in q.captured_queries]
    # One steady report first: the ETag the GET stored could not say which Redis answered, so
    # the first report computes it again (once per node; fleet/desired_version.py).
    post(report_body(node, 10**9 + 1, ops, 2000, desired_etag=etag, with_gpus=False))
    with CaptureQueriesContext(connection) as q:
        answer = post(report_body(node, 10**9 + 2, ops, 2000, desired_etag=etag, with_gpus=False)).json()
    assert answer.get("desired") is None, answer     # (an older storefront: no desired at all)
    captured["report"] = [x["sql"] for x in q.captured_queries]
    out["cpu_ms"] = _cpu_per_request(client, node, key, auth, ops, etag)
    for name, sqls in captured.items():
        if os.environ.get("BENCH_FLEET_SQL"):
            print(f"-- {name}:\n" + "\n".join(f"  {q[:160]}" for q in sqls))
        out[name] = {"queries": len(sqls),
                     "writes": sum(s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) for s in sqls)}
        if explain:
            print(f"EXPLAIN of one {name} ({len(sqls)} queries):")
            with connection.cursor() as cursor:
                for sql in sqls:
                    if not sql.lstrip().upper().startswith(("SELECT", "UPDATE")):
                        continue
                    cursor.execute("EXPLAIN " + sql)
                    plan = [row[0] for row in cursor.fetchall()]
                    scanned = {m.group(1) for line in plan if (m := re.search(r"Seq Scan on (\w+)", line))}
                    big = [f"{table} ({rows:,} rows)" for table, rows in _table_rows(cursor, scanned).items()
                           if rows > SMALL_TABLE_ROWS]
                    small = sorted(scanned - {b.split()[0] for b in big})
                    print(f"  {sql[:110]}…\n    {plan[0].strip()}"
                          + (f"\n    !! sequential scan of {', '.join(big)}" if big else "")
                          + (f"\n    (sequential scans of tables under {SMALL_TABLE_ROWS} rows, the planner's "
                             f"choice: {', '.join(small)})" if small else ""))
    return out


def _table_rows(cursor, tables: set[str]) -> dict[str, int]:
    """Rows per table as the statistics have them (ANALYZE ran after the warm-up)."""
    if not tables:
        return {}
    cursor.execute("SELECT relname, reltuples::bigint FROM pg_class WHERE relname = ANY(%s)", [sorted(tables)])
    return dict(cursor.fetchall())


def _cpu_per_request(client, node: dict, key, auth: dict, ops: dict, etag: str, n: int = 60) -> dict:
    """This process's CPU milliseconds per request (Django's side; PostgreSQL and Redis run
    elsewhere), the median of 3 rounds of n: robust to a busy machine, unlike wall-clock.
    The steady requests: a desired poll answered 304, a report answered `"desired": null`."""
    seq = [2 * 10**9]

    def desired_304():
        response = client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **auth)
        assert response.status_code == 304, response.status_code

    def report():
        seq[0] += 1
        node["seq"] = seq[0]            # the generator goes on from here: a lower seq is refused (409)
        body = report_body(node, seq[0], ops, 3000 + seq[0], desired_etag=etag, with_gpus=seq[0] % 20 == 1)
        response = client.post("/agent/v1/report", body, content_type="application/json",
                               HTTP_X_NODE_SIGNATURE=base64.b64encode(key.sign(body)).decode(), **auth)
        assert response.status_code == 200, response.content

    def bare():
        assert client.get("/bench/bare").status_code == 200

    out = {}
    for name, call in (("bare", bare), ("desired", desired_304), ("report", report)):
        rounds = []
        for _ in range(3):
            t = time.process_time()
            for _ in range(n):
                call()
            rounds.append((time.process_time() - t) * 1000 / n)
        out[name] = sorted(rounds)[1]
    return out


def server_counters(db, database: str, master_pids: list[int]) -> dict:
    """The web workers' CPU seconds (every host's) and the rows the database has written, so far."""
    written = db.execute("SELECT tup_inserted + tup_updated + tup_deleted FROM pg_stat_database "
                         "WHERE datname = %s", (database,)).fetchone()[0]
    return {"cpu": sum(worker_cpu_seconds(pid) for pid in master_pids), "rows": written}


def worker_cpu_seconds(master_pid: int) -> float:
    """User+system CPU seconds of the web server's workers so far (Linux /proc)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    try:
        children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    except OSError:
        return 0.0
    for pid in children:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> None:
    args = parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    on_services(args.use_system_services, lambda url, redis_url: bench(args, url, redis_url))


def describe_services(url: str, redis_url: str) -> str:
    """The settings of the servers that decide what a long run costs, as the servers report them."""
    import psycopg
    import redis

    with psycopg.connect(url, autocommit=True) as db:
        pg = {name: db.execute(f"SHOW {name}").fetchone()[0] for name in
              ("server_version", "autovacuum", "shared_buffers", "synchronous_commit", "max_wal_size")}
    client = redis.Redis.from_url(redis_url)
    aof, version = client.config_get("appendonly")["appendonly"], client.info("server")["redis_version"]
    client.close()
    return (f"PostgreSQL {pg['server_version'].split()[0]} (autovacuum {pg['autovacuum']}, shared_buffers "
            f"{pg['shared_buffers']}, synchronous_commit {pg['synchronous_commit']}, max_wal_size "
            f"{pg['max_wal_size']}), Redis {version} (appendonly {aof})")


def bench(args, url: str, redis_url: str) -> None:
    import psycopg

    print(f"services: {describe_services(url, redis_url)}", flush=True)

    name, var_dir = f"bench_fleet_{os.getpid()}", tempfile.mkdtemp(prefix="bench-fleet-")
    admin_url = with_db(url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    servers = []
    try:
        # every node at --poll, whatever the fleet's size: what the storefront tells them too
        # (fleet/pacing.py would lengthen it for a large fleet; bench/store.py runs that pace)
        poll = str(int(args.poll) or 1)
        env = production_env(with_db(url, name), redis_url, var_dir, NODE_POLL_SECONDS=poll,
                             NODE_POLL_MAX_SECONDS=poll, NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE="1000")
        env["HOST_AGENT"] = "fleet.driver.NodeAgentDriver"      # production's driver: real nodes
        manage(env, "migrate", "--noinput")
        manage(env, "load_demo")
        os.environ.update({k: v for k, v in env.items() if k not in ("PYTHONPATH",)})
        import django
        django.setup()
        from django.conf import settings
        timers = compressed_timers(args.poll)
        for timer, seconds in timers.items():   # the server's and this process's (per_poll_costs)
            env[timer] = str(seconds)
            setattr(settings, timer, seconds)
        print("timers: " + ", ".join(f"{timer} {seconds} s" for timer, seconds in timers.items()) +
              (f" (x{args.poll / FLEET_POLL:g}: a {args.poll:g} s poll stands for {FLEET_POLL:g} s)"
               if args.poll < FLEET_POLL else ""), flush=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        ports = [port]
        for _ in range(args.hosts - 1):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                ports.append(probe.getsockname()[1])
        for i, host_port in enumerate(ports):
            if args.server == "granian":
                servers.append(Granian(env, host_port, args.workers, args.threads, Path(var_dir) / f"granian{i}.log"))
            else:
                worker_class = args.worker_class or ("gthread" if args.threads > 1 else "sync")
                servers.append(Gunicorn(env, host_port, args.workers, worker_class, args.threads,
                                        Path(var_dir) / f"gunicorn{i}.log"))
        print(f"{args.server}: {args.hosts} host(s) x {args.workers} workers x {args.threads} threads", flush=True)
        bases = [f"http://127.0.0.1:{p}" for p in ports]
        base = bases[0]
        for each in bases:
            wait_http(each + "/healthz")
        fleet: list[dict] = []
        for size in sorted(args.sizes):
            t = time.perf_counter()
            fleet += enrol_fleet(size - len(fleet), len(fleet))
            from django.db import connection
            with connection.cursor() as cursor:     # what autovacuum does after a bulk load:
                cursor.execute("ANALYZE")           # the planner sees 10,000 nodes, not the demo's 6
            print(f"== {size} nodes ({size * 8:,} GPUs, {size * LEASES_PER_NODE:,} leases) enrolled in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
            with psycopg.connect(with_db(url, name), autocommit=True) as db:
                if args.warm:
                    t = time.perf_counter()
                    for i, each in enumerate(bases):   # each node warms on the host it polls
                        asyncio.run(warm(each, fleet[i::len(bases)], args.connections))
                    print(f"  warm-up (each node's first GET and full report, untimed): "
                          f"{time.perf_counter() - t:.1f} s", flush=True)
                    with connection.cursor() as cursor:   # the issued ops and instance reports the
                        cursor.execute("ANALYZE")         # first round wrote: EXPLAIN sees the fleet's
                costs = per_poll_costs(fleet, explain=size == max(args.sizes) and not args.smoke)
            settle = args.settle if args.settle is not None else SETTLE_POLLS * args.poll
            figures = {}
            for telemetry in {"off": (False,), "on": (True,), "both": (False, True)}[args.telemetry]:
                with psycopg.connect(with_db(url, name), autocommit=True) as db:
                    run = asyncio.run(drive(bases, fleet, poll=args.poll, duration=args.duration,
                                            connections=args.connections, protocol=args.protocol, settle=settle,
                                            mark=functools.partial(server_counters, db, name, [s.pid for s in servers]),
                                            sampler=Sampler([s.pid for s in servers]), telemetry=telemetry))
                figures[telemetry] = _print_run(args, size, run, costs, settle, base, telemetry)
            if len(figures) == 2:
                (rate0, p0), (rate1, p1) = figures[False], figures[True]
                print(f"telemetry: {size} nodes: with/without sustained {rate1 / max(rate0, 0.1):.2f}, "
                      f"p99 report {p1:.1f} / {p0:.1f} ms = {p1 / max(p0, 0.1):.2f}", flush=True)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"(server and tools CPU: {usage.ru_utime + usage.ru_stime:.1f} s)")
    finally:
        for each in servers:
            each.stop()
        if "django.db" in sys.modules:
            from django.conf import settings
            if settings.configured:
                from django.db import connections
                connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(var_dir, ignore_errors=True)
        print(f"dropped {name}")


def _print_run(args, size: int, run: dict, costs: dict, settle: float, base: str, telemetry: bool):
    """One counted run's figures; returns (sustained req/s, p99 report ms)."""
    rows, server_cpu = run["server"]["rows"], run["server"]["cpu"]
    print(f"  counted from {settle:g} s after the start (untimed: each worker meets each node)")
    bare = run_wrk(base + "/bench/bare", [], max(2, int(args.duration // 6)), 16, 1)
    # Answers inside the counted window, over its length: the requests sent in it, over
    # the window plus the time their last answers took, understated the rate.
    rate = run["answered"] / run["duration"]
    polls = max(1, len(run["lat"]["report"]))
    d99, r99 = percentile(run["lat"]["desired"], 99), percentile(run["lat"]["report"], 99)
    print(f"  protocol {args.protocol}: {run['gets']} GET /agent/v1/desired, {len(run['lat']['report'])} reports; "
          f"asked {(2 if args.protocol == 'get' else 1) * size / args.poll:.1f} req/s, sustained {rate:.1f} req/s ({run['answered']} answers in {run['duration']:g} s); "
          f"errors {run['errors']} {run['why'] or ''}, polls late by a whole interval {run['late']}, "
          f"304 answers {run['not_modified']} of {polls}")
    print(f"  desired p50 {percentile(run['lat']['desired'], 50):.1f} ms p99 {d99:.1f} ms; "
          f"report p50 {percentile(run['lat']['report'], 50):.1f} ms p99 {r99:.1f} ms; p99 of the reports "
          f"sent in each third of the window " + " / ".join(f"{ms:.0f}" for ms in run["p99_by_third"]) + " ms")
    for line in report(run["slices"]):
        print(line)
    if args.timeline:
        write_tsv(run["slices"], args.timeline if len(args.sizes) == 1 else f"{args.timeline}.{size}")
    print("  per request: " + ", ".join(f"{name} {c['queries']} queries ({c['writes']} writes)"
                                      for name, c in costs.items() if name != "cpu_ms") + "; "
          f"rows written {rows / polls:.1f} per poll+report")
    cpu = costs["cpu_ms"]
    print(f"  CPU per request in-process (Django side): bare view {cpu['bare']:.2f} ms, desired (304) "
          f"{cpu['desired']:.2f} ms ({cpu['desired'] / cpu['bare']:.1f}x bare), report {cpu['report']:.2f} ms "
          f"({cpu['report'] / cpu['bare']:.1f}x bare); web workers under load "
          f"{1000 * server_cpu / max(1, run['requests']):.2f} ms per request "
          f"({server_cpu:.1f} s for {run['requests']} requests); load average {os.getloadavg()[0]:.1f}")
    print(f"  generator CPU {run['generator_cpu']:.1f} s of {run['elapsed']:.1f} s "
          f"({100 * run['generator_cpu'] / run['elapsed']:.0f}% of a core); bare Django view "
          f"{bare['rps']:.0f} req/s; ratio sustained/bare {rate / max(bare['rps'], 0.1):.2f}")
    print(f"fleet: {size} nodes at {args.poll:g} s poll: {rate:.1f} req/s, p99 desired {d99:.1f} ms, "
          f"p99 report {r99:.1f} ms" + (f" ({args.hosts} hosts x {args.workers} workers)" if args.hosts > 1
                                         else "") + (" (telemetry on)" if telemetry else ""), flush=True)
    return rate, r99


if __name__ == "__main__":
    main()
