"""The storefront's side of the tests that run the real agent against the live server:
database calls from the test thread, and what the node's dockerd says of a lease's
container."""
import time

from django.db import OperationalError


def shared_db(call, *args, **kwargs):
    """Run a database call from the test thread while the live server's thread may hold
    the (in-memory SQLite) database: retry "database table is locked". Every call here is
    one transaction, so a retry never repeats half of one. PostgreSQL never needs it."""
    for _ in range(100):
        try:
            return call(*args, **kwargs)
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.1)
    return call(*args, **kwargs)


def lease_state(lease_id):
    from rental.models import Lease
    return shared_db(Lease.objects.get, pk=lease_id)


def container_started_at(dockerd, lease_id):
    found = dockerd.client().containers.list(filters={"name": f"lease-{lease_id}"})
    return found[0].attrs["State"]["StartedAt"] if found else None


def container_status(dockerd, lease_id):
    # sparse: no inspect per container, which races with the agent removing it (404)
    found = dockerd.client().containers.list(all=True, sparse=True,
                                             filters={"name": f"lease-{lease_id}"})
    return found[0].status if found else None
