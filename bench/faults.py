"""Fault drills against the production stack: disruptive, so a script and not a test. Prints
figures; exits non-zero when an expectation fails.

  pg     PostgreSQL restarted under load (a fast-mode restart: `pg_ctl restart -m fast`, or
         `pg_ctlcluster <ver> main restart` on the system's cluster): the web server keeps running;
         while the database is away answers are clean 503s with Retry-After (never 500s), and
         every endpoint answers 200 again within seconds, with no web server restart (same
         master, same workers; CONN_HEALTH_CHECKS drops the dead connections).
  redis  Redis stopped for --redis-seconds (default 60) while pages are under load and a
         real Celery worker + beat run the lifecycle every 5 s: pages keep answering 200 (the
         cache fails open, core/cache.py); beat and worker reconnect by themselves; leases
         whose term ended during the outage are suspended after it — each exactly once — and
         the leases that renewed from their balance are extended once, never twice.

By default the drill brings its own servers (bench/private_services.py): a PostgreSQL
cluster `initdb`-ed into a temp dir (Debian's /usr/lib/postgresql/<ver>/bin; run as the
`postgres` user when we are root) and a `redis-server`, each on a free loopback port. It
restarts and stops only those, so the machine's shared PostgreSQL and Redis — and every test
or agent using them — never notice. They are removed at the end whatever happens: finally
blocks and atexit, SIGTERM/SIGHUP handled like Ctrl-C, and a watchdog process that cleans up
if the script is SIGKILLed. DATABASE_URL and REDIS_URL are then ignored.

--use-system-services drills the machine's own cluster instead (`pg_ctlcluster`, Redis on
6379, as DATABASE_URL and REDIS_URL name them), for an operator who wants exactly that box
tested; both are left running when the script ends, whatever happens.

Either way it makes a throwaway database (bench_faults_<pid>, dropped at the end) with the
demo catalog, and serves it as production does (scripts/start.sh web: granian, 2 workers x 2
threads, production settings) on a
free port of 127.0.0.1.

    .venv/bin/python bench/faults.py pg redis [--load-seconds 30] [--redis-seconds 60]
    .venv/bin/python bench/faults.py pg redis --smoke          # seconds: checks it runs (CI)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python bench/faults.py pg redis --use-system-services
"""
import argparse
import http.client
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drill_services import PrivateServices, SystemServices, exit_on_signals  # noqa: E402
from load import BASE, PY, Granian, manage, production_env, wait_http, with_db  # noqa: E402
from private_services import free_port  # noqa: E402

CELERY = str(Path(PY).with_name("celery"))
PORT = free_port()  # the web server: never a port another run or service holds
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P faults@host"
FAILED: list[str] = []


def expect(ok: bool, what: str) -> None:
    print(("  ok   " if ok else "  FAIL ") + what, flush=True)
    if not ok:
        FAILED.append(what)


# --- load ---------------------------------------------------------------------------------------

class Load:
    """Threads requesting the URLs round-robin until stopped or the deadline (bounded in time
    and count); every answer is recorded as (t, url, status) — status 0 = no HTTP answer."""

    def __init__(self, urls: list[tuple[str, dict]], threads: int = 8, max_seconds: float = 300,
                 max_requests: int = 500_000):
        self.urls, self.records, self.stop = urls, [], threading.Event()
        self.deadline, self.max_requests = time.monotonic() + max_seconds, max_requests
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]
        self.t0 = time.monotonic()
        for thread in self.threads:
            thread.start()

    def run(self, i: int) -> None:
        n = i
        while not self.stop.is_set() and time.monotonic() < self.deadline and len(self.records) < self.max_requests:
            path, headers = self.urls[n % len(self.urls)]
            n += 1
            started = time.monotonic()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                response.read()
                status, retry_after = response.status, response.getheader("Retry-After")
                conn.close()
            except OSError:
                status, retry_after = 0, None
                time.sleep(0.05)
            with self.lock:
                self.records.append((started - self.t0, path, status, retry_after, time.monotonic() - started))

    def finish(self) -> list:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)
        return self.records

    def now(self) -> float:
        return time.monotonic() - self.t0


def summary(records, label: str) -> Counter:
    statuses = Counter(r[2] for r in records)
    print(f"  {label}: {len(records)} requests, statuses {dict(sorted(statuses.items()))}", flush=True)
    return statuses


# --- environment --------------------------------------------------------------------------------

def worker_pids(web: Granian) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(web.pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


class Proc:
    def __init__(self, name: str, cmd: list[str], env: dict, log: Path):
        self.name, self.log_path, self.log = name, log, open(log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=BASE, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


def django_setup(env: dict) -> None:
    for key in ("DATABASE_URL", "REDIS_URL", "VAR_DIR", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "HOST_AGENT"):
        os.environ[key] = env[key]
    os.environ["DJANGO_SETTINGS_MODULE"] = "storefront.settings"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ["DB_CONN_MAX_AGE"] = "0"
    sys.path.insert(0, str(BASE))
    import django

    django.setup()


# --- drills -------------------------------------------------------------------------------------

def drill_postgres(services, web: Granian, token: str, load_seconds: float) -> None:
    print(f"\n== PostgreSQL restarted under load ({services.restart_command}; web server pid {web.pid})",
          flush=True)
    from django.db import connections

    connections.close_all()
    db_urls = [("/healthz", {}), ("/gpus/rtx-3090/", {}), ("/api/v1/leases", {"Authorization": f"Bearer {token}"}),
               ("/gpus/?vendor=nvidia&min_vram=40", {}), ("/api/v1/offers", {}), ("/faq/", {})]
    workers_before = worker_pids(web)
    load = Load(db_urls, threads=8, max_seconds=load_seconds + 60)
    time.sleep(5)
    t_restart = load.now()
    started = time.monotonic()
    services.pg_restart()
    restart_took = time.monotonic() - started
    t_back = load.now()
    time.sleep(max(0.0, load_seconds - load.now()))
    records = load.finish()
    print(f"  {services.restart_command} took {restart_took:.1f} s (t = {t_restart:.1f} → {t_back:.1f} s of "
          f"{load.now():.0f} s of load)")
    before = [r for r in records if r[0] < t_restart]
    during = [r for r in records if t_restart <= r[0] < t_back]
    after = [r for r in records if r[0] >= t_back]
    summary(before, "before the restart")
    s_during = summary(during, "during the restart")
    for path, _headers in db_urls:
        print(f"    {path:36} {dict(sorted(Counter(r[2] for r in during if r[1] == path).items()))}")
    s_after = summary(after, "after the restart")
    all_statuses = Counter(r[2] for r in records)
    errors = [r for r in records if r[2] >= 500]
    expect(all_statuses[500] == 0, f"no 500 at all (got {all_statuses[500]})")
    expect(all(r[2] == 503 for r in errors), f"every error is a 503 ({Counter(r[2] for r in errors)})")
    expect(all(r[3] for r in errors if r[2] == 503 and r[1] != "/healthz"),
           "every 503 (but /healthz's own) carries Retry-After")
    expect(s_during[0] == 0 and s_after[0] == 0, "the web server never stopped answering (no connection errors)")
    first_ok = {path: min((r[0] for r in after if r[1] == path and r[2] == 200), default=None) for path, _ in db_urls}
    recovered = max((t for t in first_ok.values() if t is not None), default=None)
    expect(all(t is not None for t in first_ok.values()), "every endpoint answered 200 again")
    if recovered is not None:
        print(f"  every endpoint answering 200 again {recovered - t_back:.2f} s after the restart returned")
    late = [r for r in after if r[0] > (recovered or t_back) + 1 and r[2] != 200]
    expect(not late, f"no error more than 1 s after recovery ({len(late)})")
    expect(web.proc.poll() is None and worker_pids(web) == workers_before,
           "same web server and workers: no restart needed")
    tracebacks = web_log(web).count("Traceback")
    expect(tracebacks == 0, f"no traceback in the web server's log ({tracebacks})")
    print(f"  503s: {s_during[503] + s_after[503] + Counter(r[2] for r in before)[503]}; "
          f"p50/max latency during the restart: {median([r[4] for r in during]) * 1000:.0f} / "
          f"{max([r[4] for r in during], default=0) * 1000:.0f} ms")


def web_log(web: Granian) -> str:
    web.log.flush()
    return Path(web.log.name).read_text(errors="replace")


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def seed_leases(n: int):
    """n paid 1-week leases on demo stock, ordered a week ago; even ones can auto-renew from
    their balance (it holds two weeks)."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.services import balance_top_up, checkout_place_order
    from inventory.models import Offer, Site
    from rental.models import Image
    from rental.services import account_create

    offer, image = Offer.objects.get(slug="rtx-3090"), Image.objects.get(slug="pytorch-2.5-cuda-12.4")
    sites = list(Site.objects.all())
    start, leases = timezone.now() - timedelta(days=7), []
    for i in range(n):
        customer = account_create(username=f"fault{i}", password="faults password 123")
        balance_top_up(customer=customer, amount_cents=(2 if i % 2 == 0 else 1) * offer.weekly_cents, now=start)
        lease, _invoice = checkout_place_order(customer=customer, offer=offer, site=sites[i % len(sites)],
                                               term="week", image=image, ssh_public_key=KEY, pay_from_balance=True,
                                               now=start)
        leases.append(lease.pk)
    return leases


def end_terms(ids: list[int], first_end_in: float, spread: float) -> None:
    """The drill's clock: a lease's first term starts when it becomes active (a week from
    then), so the terms of the freshly provisioned leases are moved to end between
    first_end_in and first_end_in + spread seconds from now, as if that week had passed.
    Only the dates move; every transition after this is the lifecycle's own."""
    from datetime import timedelta

    from django.utils import timezone

    from rental.models import Lease

    now = timezone.now()
    for i, pk in enumerate(ids):
        end = now + timedelta(seconds=first_end_in + spread * i / max(1, len(ids) - 1))
        Lease.objects.filter(pk=pk).update(started_at=end - timedelta(days=7), ends_at=end)


def lease_report(ids):
    from django.db.models import Count

    from billing.models import Invoice, LedgerEntry
    from rental.models import Lease, LeaseEvent

    events = Counter(LeaseEvent.objects.filter(lease_id__in=ids).values_list("lease_id", "kind"))
    renewals = dict(Invoice.objects.filter(lease_id__in=ids, kind="renewal").values_list("lease_id")
                    .annotate(n=Count("id")).values_list("lease_id", "n"))
    customers = dict(Lease.objects.filter(pk__in=ids).values_list("pk", "customer_id"))
    charged = Counter({i: LedgerEntry.objects.filter(kind="renewal", account__customer_id=customers[i]).count()
                       for i in ids})
    states = dict(Lease.objects.filter(pk__in=ids).values_list("pk", "state"))
    return events, renewals, charged, states


def lifecycle_finished_at():
    """When beat's lifecycle tick last finished; the epoch's start when it never has (on a
    busy machine the leases can be provisioned before the first tick completes)."""
    from datetime import UTC, datetime

    from billing.models import JobRun

    run = JobRun.objects.filter(name="lifecycle").first()
    return run.last_finished_at if run and run.last_finished_at else datetime.min.replace(tzinfo=UTC)


def drill_redis(services, env: dict, var_dir: Path, outage: int, tick: float, settle: float) -> None:
    print(f"\n== Redis stopped for {outage} s under load, with a Celery worker and beat (tick {tick:g} s)", flush=True)
    from django.db import connections
    from django.utils import timezone

    from rental.models import Lease, LeaseEvent

    celery_env = {**env, "DJANGO_SETTINGS_MODULE": "faults_settings", "FAULTS_TICK": str(tick),
                  "PYTHONPATH": f"{BASE / 'bench'}:{BASE}", "HOST_AGENT_FAKE_DELAY": "0", "DB_CONN_MAX_AGE": "0"}
    n = 10
    ids = seed_leases(n)
    connections.close_all()
    worker = Proc("worker", [CELERY, "-A", "storefront", "worker", "--pool=solo", "-n", "faults@%h", "--without-gossip",
                             "--without-mingle", "-l", "info"], celery_env, var_dir / "worker.log")
    beat = Proc("beat", [CELERY, "-A", "storefront", "beat", "-l", "info", "-s", str(var_dir / "beat-schedule")],
                celery_env, var_dir / "beat.log")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and Lease.objects.filter(pk__in=ids, state="active").count() < n:
            time.sleep(1)
        connections.close_all()
        expect(Lease.objects.filter(pk__in=ids, state="active").count() == n,
               f"before the outage: the worker provisioned all {n} leases")
        # The outage starts 20 s after the worker did, and at least two ticks from now (the
        # renewal invoices are made before it); the terms end inside it, a margin from
        # either edge (10 s of a minute's outage, 1 s of a smoke run's 5 s), so their
        # suspension is due while beat cannot reach the broker.
        outage_in = max(2 * tick + 1, 20 - (time.monotonic() - (deadline - 60)))
        margin = min(10.0, outage / 5)
        end_terms(ids, first_end_in=outage_in + margin, spread=outage - 2 * margin)
        outage_at = time.monotonic() + outage_in
        runs_before = lifecycle_finished_at()
        pages = [("/", {}), ("/gpus/?vendor=nvidia&min_vram=40", {}), ("/gpus/rtx-3090/", {}), ("/faq/", {}),
                 ("/api/v1/estimate?model=llama-2-13b&method=lora", {}), ("/api/v1/offers", {}),
                 ("/size/?model=llama-2-13b&method=lora", {"HX-Request": "true"}), ("/healthz", {})]
        load = Load(pages, threads=6, max_seconds=outage + 90)
        time.sleep(max(0.0, outage_at - time.monotonic()))
        connections.close_all()
        t_stop = load.now()
        services.redis_stop()
        stopped_at = timezone.now()
        time.sleep(1)
        expect(not services.redis_ready(), "Redis is down")
        time.sleep(max(0, outage - 1))
        services.redis_start()
        for _ in range(40):
            if services.redis_ready():
                break
            time.sleep(0.25)
        t_start, started_at = load.now(), timezone.now()
        print(f"  Redis down from t = {t_stop:.1f} to {t_start:.1f} s", flush=True)
        time.sleep(settle)
        records = load.finish()
        during = [r for r in records if t_stop <= r[0] < t_start]
        s_during = summary(during, "pages while Redis was down")
        summary([r for r in records if r[0] >= t_start], "pages after Redis returned")
        expect(set(s_during) == {200} and len(during) > 0, "every page answered 200 while Redis was down")
        before = [r[4] for r in records if r[0] < t_stop]
        print(f"  page latency before: p50 {median(before) * 1000:.1f} ms; "
              f"while down: p50 {median([r[4] for r in during]) * 1000:.1f} ms, "
              f"max {max([r[4] for r in during], default=0) * 1000:.0f} ms")
        # Catch-up: every lease whose term ended is suspended or extended, once.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            due = Lease.objects.filter(pk__in=ids, ends_at__lte=timezone.now(), state="active").count()
            if not due and lifecycle_finished_at() > started_at:
                break
            time.sleep(1)
        time.sleep(2 * tick)  # and two more ticks, which must change nothing
        connections.close_all()
        events, renewals, charged, states = lease_report(ids)
        last_run = lifecycle_finished_at()
        expect(worker.alive() and beat.alive(), "worker and beat are still the same processes (reconnected)")
        expect(last_run > started_at and last_run > runs_before,
               f"the lifecycle ran again after Redis returned (last at {last_run:%H:%M:%S})")
        suspended = [i for i in ids if states[i] == "suspended"]
        extended = [i for i in ids if events[(i, "extended")]]
        expect(sorted(suspended) == sorted(ids[1::2]), f"the {n // 2} leases without balance are suspended "
                                                       f"({len(suspended)})")
        expect(sorted(extended) == sorted(ids[0::2]), f"the {n // 2} leases with balance renewed ({len(extended)})")
        expect(all(events[(i, "suspended")] <= 1 and events[(i, "extended")] <= 1 for i in ids),
               "no transition twice (none doubled)")
        expect(all(renewals.get(i) == 1 for i in ids), "one renewal invoice per lease")
        expect(all(charged[i] == (1 if i in extended else 0) for i in ids), "each renewal charged once")
        suspended_in_outage = [
            le for le in LeaseEvent.objects.filter(lease_id__in=suspended, kind="suspended")
            if stopped_at < le.at < started_at]
        expect(not suspended_in_outage, "nothing was suspended while the broker was away (beat could not send)")
        waited = [(le.at - started_at).total_seconds() for le in
                  LeaseEvent.objects.filter(lease_id__in=suspended, kind="suspended", at__gte=started_at)]
        if waited:
            print(f"  {len(waited)} suspensions that fell due during the outage ran "
                  f"{min(waited):.1f}–{max(waited):.1f} s after Redis returned")
        beat_log = Path(beat.log_path).read_text(errors="replace")
        print(f"  beat log: {beat_log.count('Sending due task')} ticks sent, "
              f"{beat_log.lower().count('error')} error lines (broker unreachable)")
    finally:
        worker.stop()
        beat.stop()
        if FAILED:  # the temp dir goes at the end: what the worker said is the first clue
            print("  worker log (tail):\n" + "\n".join(
                Path(worker.log_path).read_text(errors="replace").splitlines()[-40:]), flush=True)


SMOKE = {"load_seconds": 20, "redis_seconds": 5, "settle": 5}  # seconds: it runs, the figures mean nothing


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drills", nargs="+", choices=["pg", "redis"])
    parser.add_argument("--load-seconds", type=float, default=30, help="load around the PostgreSQL restart")
    parser.add_argument("--redis-seconds", type=int, default=60, help="how long Redis stays down (10..300)")
    parser.add_argument("--tick", type=float, default=5, help="lifecycle tick for the redis drill (s)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"the smallest size, to check it runs (CI): {SMOKE}")
    parser.add_argument("--use-system-services", action="store_true",
                        help="drill the machine's own PostgreSQL (pg_ctlcluster) and Redis on 6379, as "
                             "DATABASE_URL and REDIS_URL name them, instead of private ones")
    args = parser.parse_args()
    args.settle = 15  # seconds of load after Redis returned
    if args.smoke:
        vars(args).update(SMOKE)
    elif not 10 <= args.redis_seconds <= 300 or not 10 <= args.load_seconds <= 300:
        raise SystemExit("keep --redis-seconds and --load-seconds within 10..300")
    return args


def main() -> None:
    args = parse_args()
    exit_on_signals()
    if args.use_system_services:
        services = SystemServices(os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", ""))
    else:
        services = PrivateServices()
    try:
        run_drills(services, args)
    finally:
        print(services.close(), flush=True)
    print("\nall expectations met" if not FAILED else f"\n{len(FAILED)} expectation(s) failed: {FAILED}")
    sys.exit(1 if FAILED else 0)


def run_drills(services, args: argparse.Namespace) -> None:
    import psycopg

    url = services.database_url
    name, admin_url = f"bench_faults_{os.getpid()}", with_db(url, "postgres")
    var_dir = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    web = None
    try:
        env = production_env(with_db(url, name), services.redis_url, str(var_dir))
        manage(env, "migrate", "--noinput")
        manage(env, "load_demo")
        manage(env, "collectstatic", "--noinput")
        django_setup(env)
        from rental.accounts.services import api_token_create
        from rental.services import account_create

        token = api_token_create(customer=account_create(username="apiuser", password="faults password 123"),
                                 name="faults")[1]
        web = Granian(env, PORT, 2, 2, var_dir / "web.log")
        try:
            wait_http(f"http://127.0.0.1:{PORT}/healthz", timeout=90)  # the workers' imports on a busy box
        except SystemExit:
            print(web_log(web)[-3000:], flush=True)
            raise
        print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} cores; {services.label}; database {name}; "
              f"granian (scripts/start.sh web) 2 workers x 2 threads on 127.0.0.1:{PORT}", flush=True)
        if "pg" in args.drills:
            drill_postgres(services, web, token, args.load_seconds)
        if "redis" in args.drills:
            drill_redis(services, env, var_dir, args.redis_seconds, args.tick, args.settle)
    finally:
        if web:
            web.stop()
        if isinstance(services, SystemServices):
            services.close()  # the database must be up to drop ours
        if "django" in sys.modules:
            from django.db import connections

            connections.close_all()
        shutil.rmtree(var_dir, ignore_errors=True)
        try:
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            print(f"dropped {name}", flush=True)
        except psycopg.OperationalError as error:  # a private cluster goes with its database anyway
            print(f"!! could not drop {name}: {error}", flush=True)


if __name__ == "__main__":
    main()
