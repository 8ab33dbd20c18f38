"""issue 14: one holder at a time for a named job, across processes and hosts.

With REDIS_URL: `SET key token NX PX ttl` (the key names the database) and a compare-and-delete release, so a holder
whose lock expired never deletes its successor's. Without Redis: a JobLock row taken by a
guarded UPDATE (`WHERE expires_at <= now`), which PostgreSQL re-checks after a concurrent
writer commits and SQLite serialises; released only by the token that took it.
While the holder lives, a thread renews the expiry every third of it, so a long run keeps
its lock and a holder killed mid-run blocks the others for one expiry at most."""
import logging
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

log = logging.getLogger(__name__)
UNLOCKED = datetime(1970, 1, 1, tzinfo=UTC)
REDIS_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
REDIS_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""


class RedisLock:
    def __init__(self, url: str):
        import redis

        self.client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)

    @staticmethod
    def key(name: str) -> str:
        """Scoped to the database the job works on: storefronts (or test databases) sharing
        one Redis do not hold each other's locks."""
        return f"joblock:{connections['default'].settings_dict['NAME']}:{name}"

    def acquire(self, name: str, token: str, ttl: timedelta) -> bool:
        return bool(self.client.set(self.key(name), token, nx=True, px=int(ttl.total_seconds() * 1000)))

    def extend(self, name: str, token: str, ttl: timedelta) -> bool:
        return bool(self.client.eval(REDIS_EXTEND, 1, self.key(name), token, int(ttl.total_seconds() * 1000)))

    def release(self, name: str, token: str) -> bool:
        return bool(self.client.eval(REDIS_RELEASE, 1, self.key(name), token))


class DatabaseLock:
    def acquire(self, name: str, token: str, ttl: timedelta) -> bool:
        from ..models import JobLock

        now = timezone.now()
        with transaction.atomic():
            JobLock.objects.get_or_create(name=name, defaults={"expires_at": UNLOCKED})
        return bool(JobLock.objects.filter(name=name, expires_at__lte=now)
                    .update(token=token, expires_at=now + ttl))

    def extend(self, name: str, token: str, ttl: timedelta) -> bool:
        from ..models import JobLock

        return bool(JobLock.objects.filter(name=name, token=token).update(expires_at=timezone.now() + ttl))

    def release(self, name: str, token: str) -> bool:
        from ..models import JobLock

        return bool(JobLock.objects.filter(name=name, token=token).update(token="", expires_at=UNLOCKED))


def lock_backend() -> RedisLock | DatabaseLock:
    return RedisLock(settings.REDIS_URL) if settings.REDIS_URL else DatabaseLock()


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
