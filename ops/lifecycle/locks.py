"""One holder at a time for a named job, across processes and hosts.

A JobLock row in the database, taken by a guarded UPDATE (`WHERE expires_at <= now`), which
PostgreSQL re-checks after a concurrent writer commits and SQLite serialises; released only by
the token that took it. The expiry is counted on the database's clock (on PostgreSQL), so two
storefront hosts whose clocks differ still agree on when a lock has expired. The lock lived in
Redis until the storefront ran on more than one host: a Redis that restarts empty, is flushed
or fails over to a replica that missed the key let a second pass start beside a running one;
the database is the one thing every host must reach anyway, and it survives its own failover
(docs/adr/0008-two-storefront-hosts.md).
While the holder lives, a thread renews the expiry every third of it, so a long run keeps
its lock and a holder killed mid-run blocks the others for one expiry at most."""
import logging
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.db import connection, connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now
from django.utils import timezone

log = logging.getLogger(__name__)
UNLOCKED = datetime(1970, 1, 1, tzinfo=UTC)


def _now():
    """The database's clock on PostgreSQL (the one clock every host shares), else the process's."""
    return Now() if connection.vendor == "postgresql" else timezone.now()


def _after(ttl: timedelta):
    now = _now()
    return ExpressionWrapper(now + ttl, output_field=DateTimeField()) if isinstance(now, Now) else now + ttl


class DatabaseLock:
    def acquire(self, name: str, token: str, ttl: timedelta) -> bool:
        from billing.models import JobLock

        with transaction.atomic():
            JobLock.objects.get_or_create(name=name, defaults={"expires_at": UNLOCKED})
        return bool(JobLock.objects.filter(name=name, expires_at__lte=_now())
                    .update(token=token, expires_at=_after(ttl)))

    def extend(self, name: str, token: str, ttl: timedelta) -> bool:
        from billing.models import JobLock

        return bool(JobLock.objects.filter(name=name, token=token).update(expires_at=_after(ttl)))

    def release(self, name: str, token: str) -> bool:
        from billing.models import JobLock

        return bool(JobLock.objects.filter(name=name, token=token).update(token="", expires_at=UNLOCKED))


def lock_backend() -> DatabaseLock:
    return DatabaseLock()


class Renewal(threading.Thread):
    """Pushes the expiry back every ttl/3 until stopped (or until the lock was lost)."""

    def __init__(self, backend, name: str, token: str, ttl: timedelta):
        super().__init__(name=f"lock-renewal-{name}", daemon=True)
        self.backend, self.lock_name, self.token, self.ttl = backend, name, token, ttl
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.ttl.total_seconds() / 3):
                if not self.backend.extend(self.lock_name, self.token, self.ttl):
                    log.warning("lock %r was lost before its holder finished", self.lock_name)
                    return
        except Exception:  # a renewal that fails lets the lock expire; the run itself goes on
            log.exception("renewing lock %r failed", self.lock_name)
        finally:
            connections.close_all()  # this thread's own connections only

    def stop(self) -> None:
        self.stopped.set()
        self.join()


@contextmanager
def exclusive(name: str, *, ttl: timedelta) -> Iterator[bool]:
    """``with exclusive("lifecycle", ttl=…) as held:`` — held is False when another
    process holds the lock; the body then does nothing and returns at once."""
    backend, token = lock_backend(), secrets.token_hex(16)
    if not backend.acquire(name, token, ttl):
        yield False
        return
    renewal = Renewal(backend, name, token, ttl)
    renewal.start()
    try:
        yield True
    finally:
        renewal.stop()
        if not backend.release(name, token):
            log.warning("lock %r expired before its holder finished", name)
