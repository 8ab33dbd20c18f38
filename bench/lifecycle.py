"""Does a lifecycle pass cost what the due leases cost, or what the table costs?

Creates a throwaway PostgreSQL database (bench_lifecycle_<pid>, dropped at the end) and, for
10,000 / 100,000 / 1,000,000 leases, fills it with bulk SQL (INSERT … SELECT over
generate_series): a fixed live population (5,000 active leases ending in 4–30 days, 500
suspended ones inside their hold with their notice sent, 20 network volumes attached to
active leases) and, for the rest, history — wiped leases (key destroyed, order invoice paid)
and orders cancelled unpaid. Nothing is due. It then times lifecycle passes
(ops.lifecycle.SWEEPS, every sweep once) and prints the median per pass and per sweep,
the ratio 1M / 10k (≈ 1 when each sweep reads its due rows through a partial index, not
the ended table), and, at the largest size, the EXPLAIN of every sweep's selecting query.

Then the due-work case: over `--history` rows (default 1,000,000) of the same
fill, `--due` leases (default 1,000 and 10,000) each with work for the next pass — renewal
invoices (half paid from the balance: the lease is extended) with their reminders,
suspensions, releases (key destroyed, disk wiped). One pass (ops.lifecycle.run_lifecycle)
is timed: pass time, time and queries per due lease, per sweep, and whether that one pass
finished the batch (else how many passes, i.e. how long the last due lease waited).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/lifecycle.py
    … bench/lifecycle.py 10000 100000      # other sizes
    … bench/lifecycle.py --due-only --due 1000,10000 --history 1000000
    … bench/lifecycle.py --smoke           # seconds: the smallest sizes (CI, tests/bench)
"""
import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BASE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE), str(BASE / "bench")]

ACTIVE, SUSPENDED, VOLUMES = 5_000, 500, 20
PASSES = 11


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, help="idle case: leases in the table (10000 100000 1000000)")
    parser.add_argument("--due", default="1000,10000", help="due case: due leases per run, comma-separated")
    parser.add_argument("--history", type=int, default=1_000_000, help="due case: rows of history under them")
    parser.add_argument("--due-only", action="store_true", help="skip the idle case")
    parser.add_argument("--idle-only", action="store_true", help="skip the due case")
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, 2 passes: checks it runs (CI)")
    args = parser.parse_args()
    args.sizes = tuple(args.sizes) or (10_000, 100_000, 1_000_000)
    args.due = tuple(int(n) for n in args.due.split(",") if n)
    args.passes = PASSES
    if args.smoke:
        args.sizes, args.due, args.history, args.passes = (ACTIVE + SUSPENDED + 500,), (40,), ACTIVE + SUSPENDED + 500, 2
    return args


def with_db(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` still drops the database
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("Set DATABASE_URL to a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/postgres")
    import psycopg

    name = f"bench_lifecycle_{os.getpid()}"
    admin_url = with_db(url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        os.environ["DATABASE_URL"] = with_db(url, name)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")
        # Production settings (DEBUG off) refuse to start without these.
        os.environ.setdefault("SECRET_KEY", "bench-" + "k" * 50)
        os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1")
        os.environ.setdefault("HOST_AGENT", "rental.agent.FakeAgent")  # no GPU servers: hosts simulated
        os.environ.setdefault("LOG_LEVEL", "WARNING")
        os.environ["DB_CONN_MAX_AGE"] = "0"
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        print(f"dropped {name}")


FILLED_TABLES = ("rental_lease", "rental_diskkey", "billing_invoice", "rental_notification")
INDEXES = """
SELECT indexdef, indexname FROM pg_indexes
WHERE schemaname = 'public' AND tablename = ANY(%s) AND indexname NOT IN (SELECT conname FROM pg_constraint)
"""


def run(args) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from lifecycle_fill import fill_history  # bench/ is on sys.path

    from inventory.demo import load_demo_catalog
    from inventory.models import Offer, Site
    from rental.demo import load_demo_images
    from rental.models import Image, Lease, NetworkVolume, VolumeAttachment
    from rental.services import account_create

    call_command("migrate", verbosity=0)
    load_demo_catalog()
    load_demo_images()
    customers = [account_create(username=f"bench{i}", password="bench password 123").pk for i in range(20)]
    offers = list(Offer.objects.filter(gpu_count=1).values_list("pk", flat=True)[:5])
    site = Site.objects.get(code="DFW-1")
    image = Image.objects.get(slug="pytorch-2.5-cuda-12.4").pk
    common = {"customers": customers, "offers": offers, "sites": [site.pk], "image": image}

    def fill(total: int, now, then=None) -> None:
        with connection.cursor() as cur:
            cur.execute("TRUNCATE rental_leaseevent, rental_notification, rental_diskkey, billing_invoiceline, "
                        "billing_ledgerentry, billing_invoice, rental_volumeattachment, rental_networkvolume, "
                        "rental_lease RESTART IDENTITY CASCADE")
            cur.execute("UPDATE billing_account SET balance_cents = 0")
            # Bulk load without the secondary indexes, then build them in one go: several
            # times faster than maintaining ~20 indexes row by row.
            cur.execute(INDEXES, [list(FILLED_TABLES)])
            indexes = cur.fetchall()
            for _definition, name in indexes:
                cur.execute(f'DROP INDEX "{name}"')
        fill_history(now=now, total=total, active=ACTIVE, suspended=SUSPENDED, **common)
        if then:
            then()
        with connection.cursor() as cur:
            for definition, _name in indexes:
                cur.execute(definition)
        for i, lease in enumerate(Lease.objects.filter(state="active").order_by("pk")[:VOLUMES]):
            volume = NetworkVolume.objects.create(customer_id=lease.customer_id, site=site, name=f"v{i}", size_tb=1,
                                                  created_at=now, paid_until=lease.ends_at)
            VolumeAttachment.objects.create(volume=volume, lease=lease, attached_at=now)
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE")

    if not args.due_only:
        idle_case(args, fill)
    if not args.idle_only:
        from lifecycle_due import due_case

        due_case(args, fill, common)


def idle_case(args, fill) -> None:
    import django
    from django.utils import timezone

    from rental.models import Lease

    sizes, results = args.sizes, {}
    # The smallest size again at the end: the machine's load drifts (figures on a shared
    # machine move by ±50 %), so the small size's times are the mean of a run before and after.
    for run_number, total in enumerate((*sizes, sizes[0])):
        now = timezone.now().replace(microsecond=0)
        started = time.perf_counter()
        fill(total, now)
        states = dict(Lease.objects.values_list("state").annotate(n=django.db.models.Count("id")))
        print(f"\n{total:,} leases {states}, filled in {time.perf_counter() - started:.1f} s")
        median, fastest, pages, sweeps = figures = timed_passes(now, args.passes)
        if run_number and total == sizes[0]:
            results[total] = tuple((a + b) / 2 for a, b in zip(results[total][:3], figures[:3], strict=True))
        else:
            results[total] = figures
        slow = ", ".join(f"{name} {ms:.2f}" for name, ms in sweeps.items())
        print(f"one pass, nothing due: median {median:.1f} ms, fastest {fastest:.1f} ms of {args.passes}; "
              f"{pages:,.0f} buffer pages touched per pass (per sweep, median ms: {slow})")
        if run_number == len(sizes) - 1:
            explain(now)
    for total in sizes:
        median, fastest, pages = results[total][:3]
        print(f"{total:>9,} leases: median pass {median:6.1f} ms, fastest {fastest:6.1f} ms, {pages:5.0f} pages")
    small, big = results[sizes[0]], results[sizes[-1]]
    print(f"\n{sizes[-1]:,} / {sizes[0]:,} leases: median pass {big[0] / small[0]:.2f}×, fastest pass "
          f"{big[1] / small[1]:.2f}×, pages touched {big[2] / small[2]:.2f}× "
          f"({big[2]:,.0f} / {small[2]:,.0f}); 1.0 = the cost follows the due rows, not the table")


def blocks_touched() -> int:
    """Buffer pages this database has read or found in cache so far (pg_stat_database),
    flushed first: a measure of a pass's work that other jobs on the machine do not move."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()")
        return cur.fetchone()[0]


def timed_passes(now, passes: int) -> tuple[float, float, float, dict[str, float]]:
    """(median ms, fastest ms, pages touched per pass, median ms per sweep)."""
    from ops.lifecycle import SWEEPS

    totals, per_sweep = [], {name: [] for name, _ in SWEEPS}
    blocks_before = blocks_touched()
    for _ in range(passes):
        started = time.perf_counter()
        for name, sweep in SWEEPS:
            t = time.perf_counter()
            done = sweep(now)
            per_sweep[name].append((time.perf_counter() - t) * 1000)
            assert not done, (name, done)  # nothing is due: a transition would mean a bad fixture
        totals.append((time.perf_counter() - started) * 1000)
    pages = (blocks_touched() - blocks_before) / passes
    return (statistics.median(totals), min(totals), pages,
            {name: statistics.median(v) for name, v in per_sweep.items()})


def explain(now) -> None:
    """The plan of each sweep's selecting query: an index on the live state, never a Seq
    Scan over rental_lease."""
    from datetime import timedelta

    from django.db.models import Exists, OuterRef

    from billing.models import Invoice
    from rental import rules
    from rental.models import WIPE_PENDING, DiskKey, Lease, Notification

    queries = {
        "provisioning": Lease.objects.filter(state="provisioning").order_by("provisioning_started_at"),
        "reminders": Lease.objects.filter(state="active", ends_at__gt=now, ends_at__lte=now + timedelta(days=3))
        .exclude(Exists(Notification.objects.filter(lease=OuterRef("pk"), kind="reminder_3d",
                                                    deadline=OuterRef("ends_at")))).order_by("ends_at"),
        "renewal_invoices": Lease.objects.filter(state="active", ends_at__lte=now + rules.renewal_lead())
        .exclude(Exists(Invoice.objects.filter(lease=OuterRef("pk"), kind="renewal",
                                               term_start=OuterRef("ends_at")))).order_by("ends_at"),
        "suspend": Lease.objects.filter(state="active", ends_at__lte=now).order_by("ends_at"),
        "release": Lease.objects.filter(state="suspended", hold_until__lte=now).order_by("hold_until"),
        "state_notices (released)": Lease.objects.filter(
            state__in=["released", "wiped"], hold_until__isnull=False,
            ended_at__gte=now - rules.wipe_within()).order_by("ended_at"),
        "key_destruction": DiskKey.objects.filter(state="destroy_requested").order_by("destroy_requested_at"),
        "wipe": Lease.objects.filter(WIPE_PENDING, disk_key__state="destroyed").order_by("wipe_by"),
        "void_dead_renewals": Invoice.objects.filter(kind="renewal", state="open",
                                                     lease__state__in=["released", "wiped", "cancelled"]),
    }
    for name, query in queries.items():
        plan = query.values_list("pk", flat=True)[:500].explain()
        print(f"\nEXPLAIN {name}:\n  " + plan.replace("\n", "\n  "))
        assert "Seq Scan on rental_lease" not in plan, name


if __name__ == "__main__":
    main()
