"""Does a lifecycle pass cost what the due leases cost, or what the table costs?

Creates a throwaway PostgreSQL database (bench_lifecycle_<pid>, dropped at the end), fills
it with N active leases of which 1,000 are due (term ended an hour ago; the rest end next
month), and times one lifecycle pass (billing.lifecycle.run_lifecycle, every sweep once,
bounded batches) for N = 100,000 and N = 10,000. Prints both times, their ratio (≈ 1 when
the indexed deadlines do their job) and the EXPLAIN of the due-lease queries.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/lifecycle.py
"""
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))

DUE = 1_000
SIZES = (100_000, 10_000)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P bench@host"


def with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def main() -> None:
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
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rental.settings")
        os.environ.setdefault("HOST_AGENT", "rental.agent.FakeAgent")  # no GPU servers: hosts simulated
        os.environ.setdefault("LOG_LEVEL", "WARNING")
        os.environ["DB_CONN_MAX_AGE"] = "0"
        run()
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        print(f"dropped {name}")


def run() -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from billing.lifecycle import SWEEPS
    from billing.models import Invoice
    from inventory.demo import load_demo_catalog
    from inventory.models import Offer, Site
    from rental.demo import load_demo_images
    from rental.models import DiskKey, Image, Lease, LeaseState
    from rental.services import account_create

    call_command("migrate", verbosity=0)
    load_demo_catalog()
    load_demo_images()
    customers = [account_create(username=f"bench{i}", password="bench password 123") for i in range(20)]
    offers = list(Offer.objects.filter(gpu_count=1)[:5])
    sites = list(Site.objects.all())
    image = Image.objects.get(slug="pytorch-2.5-cuda-12.4")

    def fill(total: int, now) -> None:
        with connection.cursor() as cur:
            cur.execute("TRUNCATE rental_leaseevent, rental_notification, rental_diskkey, billing_invoiceline, "
                        "billing_ledgerentry, billing_invoice, rental_lease RESTART IDENTITY CASCADE")
        rows = []
        for i in range(total):
            due = i % (total // DUE) == 0  # spread the due ones through the table
            start = now - timedelta(days=7, hours=1) if due else now + timedelta(days=23)
            rows.append(Lease(customer=customers[i % len(customers)], offer=offers[i % len(offers)],
                              site=sites[i % len(sites)], image=image, term="week", state=LeaseState.ACTIVE,
                              price_cents=6500, ssh_public_key=KEY, pay_by=start, started_at=start,
                              provisioning_started_at=start, ends_at=start + timedelta(days=7),
                              host="bench.local", ssh_port=22000))
        Lease.objects.bulk_create(rows, batch_size=5000)
        due_ids = Lease.objects.filter(ends_at__lte=now).values_list("pk", flat=True)
        DiskKey.objects.bulk_create([DiskKey(lease_id=pk) for pk in due_ids], batch_size=5000)
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
        assert Lease.objects.count() == total and len(due_ids) == DUE

    def one_pass(now) -> tuple[float, dict, int]:
        per_sweep, made = {}, 0
        started = time.perf_counter()
        for sweep_name, sweep in SWEEPS:
            t = time.perf_counter()
            made += len(sweep(now))
            per_sweep[sweep_name] = time.perf_counter() - t
        return time.perf_counter() - started, per_sweep, made

    timings = {}
    for total in SIZES:
        now = timezone.now()
        t = time.perf_counter()
        fill(total, now)
        print(f"\n{total:,} leases, {DUE:,} due — created in {time.perf_counter() - t:.1f} s")
        if total == SIZES[0]:
            due_query = Lease.objects.filter(state=LeaseState.ACTIVE, ends_at__lte=now).order_by("ends_at")
            print("EXPLAIN of the suspend sweep's due-lease query:")
            print("  " + due_query.values_list("pk", flat=True)[:500].explain().replace("\n", "\n  "))
            renewal = (Lease.objects.filter(state__in=[LeaseState.ACTIVE, LeaseState.PROVISIONING],
                                            ends_at__lte=now + timedelta(hours=24)).order_by("ends_at"))
            print("EXPLAIN of the renewal sweep's due-lease query:")
            print("  " + renewal.values_list("pk", flat=True)[:500].explain().replace("\n", "\n  "))
        elapsed, per_sweep, made = one_pass(now)
        timings[total] = elapsed
        slow = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in per_sweep.items() if v > 0.005)
        print(f"one lifecycle pass: {elapsed:.3f} s, {made} transitions ({slow})")
        print(f"renewal invoices: {Invoice.objects.count()}, "
              f"suspended: {Lease.objects.filter(state=LeaseState.SUSPENDED).count()} (batches of 500)")
    big, small = timings[SIZES[0]], timings[SIZES[1]]
    print(f"\npass over {SIZES[0]:,} leases: {big:.3f} s; over {SIZES[1]:,}: {small:.3f} s; "
          f"ratio {big / small:.2f} (1.0 = the cost follows the {DUE:,} due leases, not the table)")


if __name__ == "__main__":
    main()
