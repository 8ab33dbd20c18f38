"""A Redis cache that fails open.

Django's RedisCache raises when Redis is unreachable, which would turn a Redis outage
into 500s on every page that reads the cache. Here every operation that fails with a
Redis error behaves like a miss (reads return the default, writes do nothing) and, for a
second after a failure, Redis is not even tried, so a stopped Redis costs each request
nothing. Pages build what they need from the database; nothing here is the only copy.
"""
import functools
import logging
import time

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.utils.functional import cached_property
from redis.exceptions import RedisError

logger = logging.getLogger("core.cache")

SKIP_SECONDS = 1.0

_MISS = {"hit": (1, {}), "get": "default", "get_many": {}, "has_key": False, "add": False, "touch": False,
         "delete": False, "incr": None, "set": None, "set_many": [], "delete_many": None, "clear": None,
         "run_script": None, "reserve": None}


class ReusedClientRedisCacheClient(RedisCacheClient):
    """Django builds a new `redis.Redis` per cache operation, and each one copies redis-py's
    table of ~170 response callbacks: a third of a millisecond of CPU per call (the
    profile of an agent poll). One client per connection pool is enough: it is thread-safe
    and takes a connection from the pool for every command."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


# The clients (so the connection pools) of this process, by location and options.
_clients: dict[tuple, ReusedClientRedisCacheClient] = {}


class FailOpenRedisCache(RedisCache):
    _down_until = 0.0

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ReusedClientRedisCacheClient
        self._scripts = {}

    @cached_property
    def _cache(self):
        """One client per process: under ASGI, Django's cache handler makes a cache object
        per asyncio task (it is context-local), and a pool of each one's own opened and closed
        a Redis connection for every request — about 1.4 ms of the nodes' watch's 2 ms."""
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        client = _clients.get(key)
        if client is None:
            client = _clients.setdefault(key, self._class(self._servers, **self._options))
        return client

    def hit(self, key, timeout: int, *, read: tuple = ()) -> tuple[int, dict]:
        """Counts one use of a fixed window (the first use starts it, `timeout` seconds) and
        reads the `read` keys, in one round trip where add(), incr() (exists + incr) and
        get_many() took four. INCR then EXPIRE NX (Redis 7): the expiry is set once per
        window and never extended; should the window end between the two, INCR counted into
        the old one and EXPIRE finds nothing — no counter is ever left without an expiry.
        Returns the count and the keys found."""
        key = self.make_and_validate_key(key)
        names = [self.make_and_validate_key(k) for k in read]
        with self._cache.get_client(key, write=True).pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, timeout, nx=True)
            if names:
                pipe.mget(names)
            results = pipe.execute()
        loads = self._cache._serializer.loads
        found = {k: loads(v) for k, v in zip(read, results[2], strict=True) if v is not None} if names else {}
        return results[0], found

    def reserve(self, key, units: int, timeout: int) -> tuple[int, int]:
        """Counts ``units`` uses of a fixed window at once (``hit``'s window: INCRBY, then
        EXPIRE NX) and reads the window's time left, in one round trip. Returns the count
        and the milliseconds left (PTTL: -2 when the key ended meanwhile)."""
        key = self.make_and_validate_key(key)
        with self._cache.get_client(key, write=True).pipeline(transaction=False) as pipe:
            pipe.incrby(key, units)
            pipe.expire(key, timeout, nx=True)
            pipe.pttl(key)
            count, _, ttl_ms = pipe.execute()
        return count, ttl_ms

    def run_script(self, source: str, *, keys: tuple = (), args: tuple = ()):
        """Runs a Lua script atomically on the keys (cache keys, prefixed as every other
        call's); redis-py sends it by hash and loads it again after a Redis restart. None
        when Redis is unavailable, so a caller must have a path without it."""
        client = self._cache.get_client(write=True)
        script = self._scripts.get((id(client), source))
        if script is None:
            script = self._scripts[(id(client), source)] = client.register_script(source)
        return script(keys=[self.make_and_validate_key(k) for k in keys], args=list(args))

    def redis_client(self):
        """The raw client, for what the cache API has no word for (pub/sub: fleet/desired_watch.py)."""
        return self._cache.get_client(write=True)

    def encoded(self, value) -> bytes | int:
        """A value as this cache stores it (what a script compares with a stored value)."""
        return self._cache._serializer.dumps(value)

    def decoded(self, stored):
        """A stored value as a script returned it, as get() would."""
        return self._cache._serializer.loads(stored)

    def _fallback(self, name, args, kwargs):
        result = _MISS[name]
        if result == "default":
            return kwargs.get("default", args[1] if len(args) > 1 else None)
        if name == "incr":
            raise ValueError("cache unavailable")
        return result

    @staticmethod
    def _guard(name):
        return FailOpenRedisCache._guarded(name, getattr(RedisCache, name))

    @staticmethod
    def _guard_own(name):
        return FailOpenRedisCache._guarded(name, getattr(FailOpenRedisCache, name))

    @staticmethod
    def _guarded(name, method):

        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            if FailOpenRedisCache._down_until > time.monotonic():
                return self._fallback(name, args, kwargs)
            try:
                return method(self, *args, **kwargs)
            except RedisError as exc:
                if FailOpenRedisCache._down_until < time.monotonic() - 10:  # log once per outage-ish
                    logger.warning("cache unavailable, serving without it: %s", exc)
                FailOpenRedisCache._down_until = time.monotonic() + SKIP_SECONDS
                return self._fallback(name, args, kwargs)
        return guarded


for _name in _MISS:
    setattr(FailOpenRedisCache, _name, FailOpenRedisCache._guard(_name) if hasattr(RedisCache, _name)
            else FailOpenRedisCache._guard_own(_name))
