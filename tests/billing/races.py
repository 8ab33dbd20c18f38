"""Races on real threads, each on its own connection, and the lease populations the race
tests build: in_threads(), an order at a chosen site, a batch of leases due for renewal."""
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections

from billing.models import Invoice, LedgerEntry
from billing.services import checkout_place_order
from inventory.models import Offer, Site, SlotAllocation
from rental.models import DiskKey, Image
from tests import deadlines
from tests.factories import KEY, new_customer

WEEK = timedelta(days=7)
PRICE = 6500  # rtx-3090, one week
postgres_only = pytest.mark.postgres  # row-lock races: skipped on SQLite by tests/conftest.py


def in_threads(*targets, timeout=60):
    """Start every target at the same moment, each on its own connection; return results
    (or the exception each raised), in order."""
    barrier = threading.Barrier(len(targets))
    results = [None] * len(targets)

    def run(i, target):
        try:
            barrier.wait()
            results[i] = target()
        except BaseException as exc:  # noqa: B036 - reported to the test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a racing thread hung (deadlock?)"
    return results


def order(customer, now, *, site, pay=True):
    return checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=site, term="week",
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                pay_from_balance=pay, now=now)


def build_due_leases(n, t0, *, prefix):
    """n paid leases (provisioning); every other customer can auto-renew from balance."""
    sites = list(Site.objects.all())
    leases = []
    for i in range(n):
        customer = new_customer(f"{prefix}{i}", balance=(2 if i % 2 else 1) * PRICE, now=t0)
        leases.append(order(customer, t0, site=sites[i % len(sites)])[0])
    return leases


def scenario(t0, prefix):
    """30 paid leases; a third auto-renew from balance. Three passes: at t0 all are
    provisioned; at T+1min ten are renewed and twenty suspended; at T+72h+1min those twenty
    are released (keys destroyed, disks wiped) and their renewals voided."""
    sites = list(Site.objects.all())
    leases = []
    for i in range(30):
        customer = new_customer(f"{prefix}{i}", balance=(2 if i % 3 == 0 else 1) * PRICE, now=t0)
        leases.append(order(customer, t0, site=sites[i % len(sites)])[0])
    return leases, [t0, t0 + WEEK + timedelta(minutes=1), t0 + WEEK + timedelta(hours=72, minutes=1)]


def summary(leases, t0):
    """Everything that matters about a scenario's result, relative to its start."""
    def rel(at):
        return at - t0 if at else None

    rows = []
    for lease in leases:
        lease.refresh_from_db()
        rows.append((
            lease.state, rel(lease.ends_at), rel(lease.hold_until), rel(lease.wipe_by),
            tuple(lease.events.order_by("id").values_list("kind", flat=True)),
            DiskKey.objects.get(lease=lease).state,
            tuple(Invoice.objects.filter(lease=lease).order_by("id").values_list("kind", "state")),
            tuple(LedgerEntry.objects.filter(account__customer=lease.customer).order_by("id")
                  .values_list("kind", "amount_cents")),
            SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).count(),
        ))
    return rows


def wait_until(condition, timeout=10.0, every=0.01):
    """Poll a condition (a state change, not a pace) until true or the timeout; returns it."""
    deadline = deadlines.Deadline(timeout)
    while not (met := condition()) and not deadline.expired():
        time.sleep(every)
    return met


def another_connection_waits_for_my_locks() -> bool:
    """PostgreSQL's own view: a backend is blocked on a lock this connection holds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
                       " AND pg_backend_pid() = ANY(pg_blocking_pids(pid)))")
        return cursor.fetchone()[0]
