"""The whole store at once on one storefront: the fleet holding its watches and reporting,
customers browsing, a lifecycle pass with a burst of due leases and the payment watcher,
all together; every endpoint's p99 under 250 ms and no node late by a whole interval.

Starts its own PostgreSQL and Redis configured as docker-compose.yml runs them
(bench/private_services.py), or with --use-system-services the servers DATABASE_URL and
REDIS_URL name. Creates a throwaway database there (bench_store_<pid>, dropped at the end),
migrates it, loads the demo catalog and collects the static files, then:

- enrols N simulated nodes (bench/fleet_nodes.py: real Ed25519 keys and credentials, 8 GPU
  slots and two running leases each) and warms each once (its first GET and reports);
- makes --customers accounts, each with one of the fleet's running leases, a login session
  (its lease page) and a read token (GET /api/v1/leases);
- adds --due leases with work for the next lifecycle pass (bench/lifecycle_fill.py's due
  set: renewals with reminders, half of them paid from the balance, suspensions, releases);
- starts the production processes as production starts them: web (scripts/start.sh web:
  granian WSGI, --workers x --threads) and watch (scripts/start.sh watch: granian ASGI, one
  worker). Celery's worker and beat are not started: bench/store_jobs.py, a process of its
  own, calls the tasks they run on beat's schedule (billing.watch_payments every
  PAYMENT_WATCH_INTERVAL_SECONDS against bench/payments.py's in-memory Core-RPC node;
  billing.lifecycle_tick --burst-at seconds into the counted window and every
  LIFECYCLE_INTERVAL_SECONDS after) — the same functions, without the broker's round trips.

Then per size (bench/store_load.py): every node holds a watch and nothing else happens (the
storefront's RSS against its own with none held, and its CPU while they only wait); then
every node runs its round at the interval the storefront tells a fleet of that size
(fleet/pacing.py: 15 s up to 2,625 nodes, 60 s at 10,000; --poll pins it), its report held until the next is due (the
report that waits; --report-then-watch: a report, then a watch held between rounds), while
customers send --rate requests/s open-loop (the catalog filtered, the calculator's htmx
fragment on varied inputs, a lease page, the API with a token, the home page) — --settle
seconds untimed, then --duration seconds counted. Printed per size: per endpoint the
requests, rate, errors, p50/p99/max (a customer's latency counts from when its request was
due to leave; a held watch's figure is how long after its asked wait it was answered); the
rounds and the nodes' late rounds; the lifecycle pass's duration and the due work it left;
the payment passes; RSS per 1,000 nodes; the CPU split by process kind (bench/timeline.py:
web, watch, jobs, PostgreSQL, Redis, the generator itself, other — the machine is shared);
and one line that scripts read:

    store: N nodes at S s poll + R customer req/s: worst p99 P ms (endpoint), late nodes L, errors E, ...: held|missed

The load generator shares the machine's cores with what it measures, so the largest N that
holds is found by giving several sizes at once (enrolled in turn, one run each); the last
line names it. Exit 1 when a size misses (an endpoint's p99 >= 250 ms, a late node, an
error) unless --no-fail; --smoke fails on errors only.

    .venv/bin/python bench/store.py 1000 3000 10000          # the storefront's pace, 90 s counted each
    .venv/bin/python bench/store.py 10000 --poll 15          # every node at 15 s, whatever the fleet
    .venv/bin/python bench/store.py 1000 --rate 40 --due 2000 --duration 120
    .venv/bin/python bench/store.py --smoke                  # seconds: 20 nodes (tests/bench)
"""
import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE), str(BASE / "bench")]

from fleet_load import warm  # noqa: E402
from fleet_nodes import FLEET_POLL, compressed_timers, enrol_fleet  # noqa: E402
from load import PY, Granian, manage, production_env, wait_http, with_db  # noqa: E402
from pg_statements import PRELOAD, StatementWindow  # noqa: E402
from private_services import free_port, on_services  # noqa: E402
from store_load import MIX, run  # noqa: E402
from timeline import Sampler, percentile, report, slices, totals  # noqa: E402
from watch import raise_open_files  # noqa: E402

TARGET_P99_MS = 250.0


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, help="nodes per run, in turn (default 1000)")
    parser.add_argument("--poll", type=float, default=None,
                        help="seconds between a node's rounds (default: what the storefront tells that many nodes)")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds counted per size")
    parser.add_argument("--settle", type=float, default=None,
                        help="untimed seconds first: each web worker meets the nodes (default: two rounds)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds every node only waits, measured")
    parser.add_argument("--rate", type=float, default=20.0, help="customer requests per second (open loop)")
    parser.add_argument("--customers", type=int, default=20, help="accounts with a lease, a session and a token")
    parser.add_argument("--due", type=int, default=1000, help="due leases for the lifecycle pass's burst")
    parser.add_argument("--burst-at", type=float, default=20.0, help="seconds into the counted window of the pass")
    parser.add_argument("--mempool", type=int, default=5000, help="transactions in the payment watcher's mempool")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="web workers (WEB_CONCURRENCY)")
    parser.add_argument("--threads", type=int, default=2, help="threads per web worker (WEB_THREADS)")
    parser.add_argument("--connections", type=int, default=64, help="the nodes' connections to web")
    parser.add_argument("--customer-connections", type=int, default=32, help="the customers' connections")
    parser.add_argument("--use-system-services", action="store_true",
                        help="the PostgreSQL and Redis of DATABASE_URL and REDIS_URL (default: the bench's own)")
    parser.add_argument("--statements", type=int, default=0, metavar="TOP",
                        help="print PostgreSQL's TOP statements by time over each counted window, its commits and "
                             "the rows written per table (pg_stat_statements preloaded in the bench's server)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a size misses a target")
    parser.add_argument("--report-then-watch", action="store_true",
                        help="nodes report to web, then watch (agents before the report that waits)")
    parser.add_argument("--smoke", action="store_true", help="seconds: 20 nodes, tiny rates (CI); fails on errors only")
    args = parser.parse_args()
    args.sizes = sorted(args.sizes or [1000])
    if args.smoke:
        args.sizes, args.poll, args.duration, args.settle, args.idle = [20], 2.0, 6.0, 2.0, 2.0
        args.rate, args.customers, args.due, args.burst_at, args.mempool = 4.0, 3, 40, 1.0, 200
        args.workers, args.connections, args.customer_connections = 1, 8, 4
    return args


def storefront_pace(size: int) -> float:
    """The interval the storefront's rule gives `size` reporting nodes (fleet/pacing.py), which
    every node then runs at; printed beside what the storefront counts and tells now (its shared
    cache's figure dropped first: a node warmed minutes ago may no longer count)."""
    from django.core.cache import cache
    from django.utils import timezone

    from fleet.pacing import REPORTING_KEY, poll_seconds, poll_seconds_for, reporting_nodes

    cache.delete(REPORTING_KEY)
    now = timezone.now()
    told, counted, pace = poll_seconds(now), reporting_nodes(now), poll_seconds_for(size)
    print(f"  pace (fleet/pacing.py): {size} nodes report every {pace} s; the storefront counts {counted} "
          f"reporting and tells them {told} s now", flush=True)
    return float(pace)


class Process:
    """A production process (scripts/start.sh <kind>) or the jobs process, in a session of its
    own, its output in a log file."""

    def __init__(self, command: list[str], env: dict, log: Path):
        self.log_path, self.log = log, open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(command, cwd=BASE, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pid = self.proc.pid

    def stop(self, wait: float = 15) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


def make_customers(n: int, fleet: list[dict]) -> list[dict]:
    """n accounts, each given one of the fleet's running leases, with a login session and a
    read-only API token."""
    from django.conf import settings
    from django.test import Client

    from rental.accounts.services import api_token_create
    from rental.models import Lease
    from rental.services import account_create

    out = []
    for i in range(n):
        user = account_create(username=f"bench-customer-{i}", password="bench password 123")
        lease = fleet[(i * 7919) % len(fleet)]["leases"][0]
        Lease.objects.filter(pk=lease).update(customer=user)
        _, token = api_token_create(customer=user, name="bench", scopes=["read"])
        client = Client()
        client.force_login(user)
        cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        out.append({"lease": lease, "token": token, "cookie": cookie})
    return out


def add_due(due: int, payers: list[int]) -> int:
    """`due` leases with work for the next pass (bench/lifecycle_fill.py's due set), the
    even payers' balances topped up so their renewals are paid; returns the first id."""
    from django.db import connection
    from django.utils import timezone
    from lifecycle_fill import fill_due

    from billing.services import balance_top_up
    from inventory.models import Offer, Site
    from rental import rules
    from rental.models import Image

    with connection.cursor() as cursor:   # the due set's ids must follow on without a gap
        cursor.execute("SELECT setval(pg_get_serial_sequence('rental_lease', 'id'), "
                       "(SELECT max(id) FROM rental_lease))")
        first = cursor.fetchone()[0] + 1
    now = timezone.now().replace(microsecond=0)
    fill_due(now=now, due=due, first_id=first, hold=rules.hold(), wipe=rules.wipe_within(), customers=payers,
             offers=list(Offer.objects.filter(gpu_count=1).values_list("pk", flat=True)[:5]),
             sites=[Site.objects.first().pk], image=Image.objects.first().pk)
    from django.contrib.auth.models import User
    for user in User.objects.filter(pk__in=payers[0::2]):
        balance_top_up(customer=user, amount_cents=6500 * due, now=now)
    return first


def bench(args, url: str, redis_url: str) -> None:
    import psycopg

    name, var_dir = f"bench_store_{os.getpid()}", tempfile.mkdtemp(prefix="bench-store-")
    admin_url = with_db(url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    processes: list[Process] = []
    missed = []
    try:
        web_port, watch_port = free_port(), free_port()
        # --poll pins every node's interval; else the storefront paces the fleet by its size
        pinned = {} if args.poll is None else {"NODE_POLL_SECONDS": str(int(args.poll) or 1),
                                               "NODE_POLL_MAX_SECONDS": str(int(args.poll) or 1)}
        settle = args.settle
        env = production_env(with_db(url, name), redis_url, var_dir, **pinned,
                             NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE="1000", WATCH_BIND=f"127.0.0.1:{watch_port}",
                             PATH=f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        env["HOST_AGENT"] = "fleet.driver.NodeAgentDriver"      # production's driver: real nodes
        t = time.perf_counter()
        for command in (("migrate", "--noinput"), ("load_demo",), ("collectstatic", "--noinput")):
            manage(env, *command)
        statements = StatementWindow(with_db(url, name)) if args.statements else None
        os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
        import django
        django.setup()
        from django.conf import settings
        from django.db import connection
        from lifecycle_due import still_due

        from rental.services import account_create
        for timer, seconds in compressed_timers(args.poll or FLEET_POLL).items():
            env[timer] = str(seconds)
        print(f"database {name}: migrated, demo catalog, static files in {time.perf_counter() - t:.1f} s", flush=True)
        payers = [account_create(username=f"bench-payer-{i}", password="bench password 123").pk for i in range(20)]
        processes.append(Granian(env, web_port, args.workers, args.threads, Path(var_dir) / "web.log"))
        processes.append(Process(["bash", "scripts/start.sh", "watch"], env, Path(var_dir) / "watch.log"))
        web_server, watch_server = processes
        web, watch = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{watch_port}"
        wait_http(web + "/healthz")
        wait_http(watch + "/healthz")
        payments_every = 2.0 if args.smoke else settings.PAYMENT_WATCH_INTERVAL_SECONDS
        print(f"web: granian WSGI {args.workers} workers x {args.threads} threads; "
              f"watch: granian ASGI, {env.get('WATCH_CONCURRENCY', os.cpu_count())} worker(s) (WATCH_CONCURRENCY); "
              f"jobs: bench/store_jobs.py (payments every {payments_every:g} s, "
              f"{args.mempool:,} mempool transactions; lifecycle every {settings.LIFECYCLE_INTERVAL_SECONDS:g} s)",
              flush=True)
        fleet: list[dict] = []
        customers: list[dict] = []
        rows = []
        for size in args.sizes:
            t = time.perf_counter()
            fleet += enrol_fleet(size - len(fleet), len(fleet))
            customers = customers or make_customers(args.customers, fleet)
            first_due = add_due(args.due, payers)
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
            asyncio.run(warm(web, fleet, args.connections))
            if not pinned:                   # every node has reported: the storefront's count now
                args.poll = storefront_pace(size)
            args.settle = 2 * args.poll if settle is None else settle
            print(f"== {size} nodes ({size * 2:,} running leases), {args.customers} customers, {args.due:,} due "
                  f"leases: enrolled and warmed in {time.perf_counter() - t:.1f} s; load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
            jobs: dict = {}
            sampler: dict = {}

            def on_schedule(first_rounds, counted_from, end, jobs=jobs, size=size):
                jobs["process"] = Process(
                    [PY, str(BASE / "bench" / "store_jobs.py"), "--until", f"{end:.3f}", "--payments-from",
                     f"{first_rounds:.3f}", "--payments-every", str(payments_every),
                     "--lifecycle-at", f"{counted_from + args.burst_at:.3f}",
                     "--lifecycle-every", str(settings.LIFECYCLE_INTERVAL_SECONDS), "--mempool", str(args.mempool)],
                    env, Path(var_dir) / f"jobs-{size}.log")

            def on_counted(sampler=sampler, jobs=jobs):
                sampler["it"] = Sampler(web_server.pid, kinds={"watch": watch_server.pid,
                                                               "jobs": jobs["process"].pid})
                sampler["it"].start()
                if not statements:
                    return sampler["it"].stop
                statements.start()
                return lambda: (sampler["it"].stop(), statements.stop())

            result = asyncio.run(run(web=web, watch=watch, fleet=fleet, customers=customers, poll=args.poll,
                                     settle=args.settle, duration=args.duration, idle=args.idle, rate=args.rate,
                                     connections=args.connections, customer_connections=args.customer_connections,
                                     watch_pid=watch_server.pid, web_pid=web_server.pid, on_schedule=on_schedule,
                                     on_counted=on_counted, reports_wait=not args.report_then_watch))
            jobs["process"].proc.wait(300)
            jobs["process"].stop()
            passes = [json.loads(line) for line in jobs["process"].log_path.read_text().splitlines()
                      if line.startswith("{")]
            left = still_due(first_id=first_due)
            row = print_size(args, size, result, passes, left, sampler["it"])
            for line in statements.report(args.duration, args.statements) if statements else ():
                print(line, flush=True)
            rows.append(row)
            if not row["held"]:
                missed.append(size)
        print_sizes(args, rows)
    finally:
        for each in processes:
            each.stop()
        if "DJANGO_SETTINGS_MODULE" in os.environ and "django.db" in sys.modules:
            from django.db import connections
            connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        print(f"dropped {name}", flush=True)
    if missed and not args.no_fail:
        sys.exit(1)


def print_size(args, size: int, result: dict, passes: list[dict], left: dict, sampler) -> dict:
    """One size's figures; returns its row for the summary."""
    figures, duration = result["figures"], result["duration"]
    before, held = result["rss_before"], result["rss_held"]
    grown = (held["web"] + held["watch"]) - (before["web"] + before["watch"])
    per_thousand = grown / size * 1000
    print(f"  {size} nodes only waiting (a watch each held): storefront RSS web {before['web']:.0f} -> "
          f"{held['web']:.0f} MiB, watch {before['watch']:.0f} -> {held['watch']:.0f} MiB: "
          f"{per_thousand:.1f} MiB per 1,000 nodes over the {before['web'] + before['watch']:.0f} MiB with none held; CPU (web + watch) while they wait {100 * result['idle_cpu']:.1f} % "
          f"of a core", flush=True)
    asked = (f"{2 * size / args.poll:.0f} req/s (a report to web and a watch each" if args.report_then_watch else
             f"{size / args.poll:.0f} req/s (a report that waits each")
    print(f"  counted {duration:g} s: nodes asked {asked} per {args.poll:g} s), customers {args.rate:g} req/s ("
          + ", ".join(f"{e} {100 * w:.0f} %" for e, w in MIX.items()) + ")")
    print("  | endpoint | requests | rate/s | errors | p50 ms | p99 ms | max ms |\n  |---|---:|---:|---:|---:|---:|---:|")
    worst, errors = (0.0, ""), 0
    for endpoint in sorted(figures.lat, key=lambda e: (not e.startswith(("POST", "GET /agent")), e)):
        lat, errs = figures.lat[endpoint], figures.errors.get(endpoint, {})
        p99 = percentile(lat, 99)
        worst = max(worst, (p99, endpoint))
        errors += sum(errs.values())
        mark = " ✗" if p99 >= TARGET_P99_MS else ""
        print(f"  | {endpoint} | {len(lat)} | {len(lat) / duration:.1f} | {sum(errs.values())}"
              f"{' ' + json.dumps(errs) if errs else ''} | {percentile(lat, 50):.1f} | {p99:.1f}{mark} | "
              f"{max(lat):.1f} |")
    print(f"  nodes: {result['rounds']} rounds due in the window (asked {size * duration / args.poll:.0f}), "
          f"late by a whole interval: {result['late_nodes']} nodes of {size} ({result['late']} rounds started late); "
          f"{result['watches']} watches, {result['changed']} changed")
    lifecycle = [p for p in passes if p["job"] == "lifecycle"]
    payments = [p for p in passes if p["job"] == "payments"]
    burst = lifecycle[0] if lifecycle else None
    niceness = next((p.get("niceness") for p in passes if p["job"] == "ready"), None)
    left_text = ", ".join(f"{k} {v}" for k, v in left.items())
    print("  lifecycle: " + (f"the burst's pass {burst['seconds']:.2f} s, {burst['result']} transitions for "
                              f"{args.due:,} due leases; left for the next pass: {left_text}" if burst else
                              "no pass ran") + (f"; {len(lifecycle) - 1} later passes, the longest "
                                                f"{max(p['seconds'] for p in lifecycle[1:]):.2f} s" if len(lifecycle) > 1 else "")
          + f"; the jobs process at niceness {niceness} (JOBS_NICENESS)")
    pay = sorted(p["seconds"] for p in payments)
    print(f"  payment watcher: {len(pay)} passes over {args.mempool:,} mempool transactions"
          + (f", median {1000 * pay[len(pay) // 2]:.0f} ms, longest {1000 * pay[-1]:.0f} ms"
             f" ({payments[-1]['result']})" if pay else ""))
    cores = totals(sampler)
    print(f"  CPU by process kind over the counted window (cores of {os.cpu_count()}): "
          + ", ".join(f"{k} {v:.2f}" for k, v in cores.items() if k not in ("busy", "iowait"))
          + f"; machine busy {cores['busy']:.2f}, iowait {cores['iowait']:.2f}; load average "
          + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    lag = result["lag"]
    print(f"  generator: CPU {result['generator_cpu']:.1f} s of {result['elapsed']:.1f} s "
          f"({100 * result['generator_cpu'] / max(result['elapsed'], 0.1):.0f} % of a core); its event loop late "
          f"p99 {percentile(lag, 99):.1f} ms, max {max(lag, default=0):.1f} ms (a late loop inflates every figure)")
    for line in report(slices(sampler, figures.sent_at, figures.sent_ms, result["timed_from"],
                              result["timed_from"] + duration)):
        print(line)
    late, lifecycle_s = result["late_nodes"], burst["seconds"] if burst else float("nan")
    held_ok = worst[0] < TARGET_P99_MS and late == 0 and errors == 0 and burst is not None
    if args.smoke:
        held_ok = errors == 0 and burst is not None
    print(f"store: {size} nodes at {args.poll:g} s poll + {args.rate:g} customer req/s: worst p99 {worst[0]:.1f} ms "
          f"({worst[1]}), late nodes {late}, errors {errors}, RSS {per_thousand:.1f} MiB per 1,000 nodes, idle CPU "
          f"{100 * result['idle_cpu']:.1f} %, lifecycle {lifecycle_s:.2f} s ({args.due} due), generator "
          f"{100 * result['generator_cpu'] / max(result['elapsed'], 0.1):.0f} % of a core: "
          f"{'held' if held_ok else 'missed'}", flush=True)
    return {"size": size, "held": held_ok, "worst": worst, "late": late, "errors": errors}


def print_sizes(args, rows: list[dict]) -> None:
    for row in rows:
        print(f"  {row['size']:>6} nodes: {'held' if row['held'] else 'missed'} (worst p99 {row['worst'][0]:.0f} ms "
              f"{row['worst'][1]}, late nodes {row['late']}, errors {row['errors']})")
    held = [row["size"] for row in rows if row["held"]]
    print(f"largest size that held: {max(held) if held else 'none'} of {', '.join(str(r['size']) for r in rows)} "
          f"(targets: p99 < {TARGET_P99_MS:.0f} ms every endpoint, no node late, no error)", flush=True)


def main() -> None:
    args = parse_args()
    raise_open_files()
    on_services(args.use_system_services, lambda url, redis_url: bench(args, url, redis_url),
                *([PRELOAD] if args.statements else []))


if __name__ == "__main__":
    main()
