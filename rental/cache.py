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

from django.core.cache.backends.redis import RedisCache
from redis.exceptions import RedisError

logger = logging.getLogger("rental.cache")

SKIP_SECONDS = 1.0

_MISS = {"get": "default", "get_many": {}, "has_key": False, "add": False, "touch": False,
         "delete": False, "incr": None, "set": None, "set_many": [], "delete_many": None, "clear": None}


class FailOpenRedisCache(RedisCache):
    _down_until = 0.0

    def _fallback(self, name, args, kwargs):
        result = _MISS[name]
        if result == "default":
            return kwargs.get("default", args[1] if len(args) > 1 else None)
        if name == "incr":
            raise ValueError("cache unavailable")
        return result

    @staticmethod
    def _guard(name):
        method = getattr(RedisCache, name)

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
    setattr(FailOpenRedisCache, _name, FailOpenRedisCache._guard(_name))
