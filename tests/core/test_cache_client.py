"""The Redis cache's connection pools are the process's, not each cache object's: under
ASGI Django's cache handler makes a cache object per asyncio task, and a pool per object
opened a Redis connection for every request (core.cache.FailOpenRedisCache._cache). No
server needed: a pool connects only when a command is sent."""
import asyncio
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.core.cache import caches
from django.test import override_settings

from core.cache import FailOpenRedisCache

LOCATION = "redis://127.0.0.1:1/3"
OPTIONS = {"socket_connect_timeout": 0.2}


def pool_of(cache) -> int:
    return id(cache._cache._get_connection_pool(True))


def test_cache_objects_of_one_location_share_one_pool_and_others_do_not():
    one, two = (FailOpenRedisCache(LOCATION, {"OPTIONS": OPTIONS}) for _ in range(2))
    assert one is not two and pool_of(one) == pool_of(two)
    assert pool_of(FailOpenRedisCache("redis://127.0.0.1:1/4", {"OPTIONS": OPTIONS})) != pool_of(one)
    assert pool_of(FailOpenRedisCache(LOCATION, {"OPTIONS": {"socket_connect_timeout": 0.3}})) != pool_of(one)


def test_each_asyncio_task_gets_a_cache_object_of_its_own_but_the_same_pool():
    seen = []

    def touch():
        cache = caches["default"]
        seen.append((id(cache), pool_of(cache)))

    async def requests():
        await asyncio.gather(*(sync_to_async(touch)() for _ in range(5)))

    with override_settings(CACHES={"default": {"BACKEND": "core.cache.FailOpenRedisCache", "LOCATION": LOCATION,
                                               "OPTIONS": OPTIONS}}):
        caches._settings = None
        with ThreadPoolExecutor(1) as pool:     # a thread with no event loop left running in it
            pool.submit(asyncio.run, requests()).result()
    caches._settings = None
    assert len({cache for cache, _ in seen}) == 5      # why the pool must not be the object's
    assert len({pool for _, pool in seen}) == 1
