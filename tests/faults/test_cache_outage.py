"""Pages keep serving when the cache is down: the Redis backend fails open
(core.cache.FailOpenRedisCache) and the catalog cache builds from the database. Checked
against a Redis port nobody listens on (no server needed), and with a cache whose every
call raises. bench/faults.py stops the real Redis for a minute under load."""
import socket

import pytest
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.test import Client, override_settings

from core.cache import FailOpenRedisCache

pytestmark = pytest.mark.django_db
PAGES = ["/", "/gpus/?vendor=nvidia&min_vram=40", "/faq/", "/size/?model=llama-2-13b&method=lora",
         "/api/v1/estimate?model=llama-2-13b&method=lora", "/api/v1/offers", "/accounts/login/"]


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connections are refused


@pytest.fixture(autouse=True)
def _cache_state_restored():
    """The fail-open layer's "down until" and the catalog's generation are process-wide: each
    test starts and ends with them reset, also when it fails half-way."""
    from inventory import selectors

    FailOpenRedisCache._down_until = 0.0
    selectors._generation_seen[:] = [None, 0.0]
    yield
    FailOpenRedisCache._down_until = 0.0
    selectors._generation_seen[:] = [None, 0.0]


def test_fail_open_backend_against_a_dead_redis():
    cache = FailOpenRedisCache(f"redis://127.0.0.1:{dead_port()}/0", {"OPTIONS": {"socket_connect_timeout": 0.2}})
    assert cache.get("k") is None and cache.get("k", "dflt") == "dflt"
    assert cache.set("k", 1) is None and cache.add("k", 1) is False and cache.get_many(["a", "b"]) == {}
    assert cache.delete("k") is False and cache.has_key("k") is False
    with pytest.raises(ValueError):
        cache.incr("k")
    FailOpenRedisCache._down_until = 0.0


class RaisingCache(LocMemCache):
    def _fail(self, *args, **kwargs):
        raise ConnectionError("cache down")

    get = set = add = delete = get_many = set_many = has_key = incr = touch = _fail


def test_pages_render_with_a_dead_redis_cache(catalog, settings):
    settings.CATALOG_CACHE_SECONDS = 10
    port = dead_port()
    FailOpenRedisCache._down_until = 0.0
    with override_settings(CACHES={"default": {"BACKEND": "core.cache.FailOpenRedisCache",
                                               "LOCATION": f"redis://127.0.0.1:{port}/0",
                                               "OPTIONS": {"socket_connect_timeout": 0.2}}}):
        caches._settings = None
        for path in PAGES:
            response = Client().get(path)
            assert response.status_code == 200, (path, response.status_code)
    FailOpenRedisCache._down_until = 0.0


def test_a_plain_raising_cache_is_contained_by_the_fail_open_layer_only(catalog, settings):
    """Without the fail-open layer a raising cache would surface as 500s: the reason for it."""
    settings.CATALOG_CACHE_SECONDS = 10
    from inventory import selectors

    selectors._generation_seen[:] = [None, 0.0]
    with override_settings(CACHES={"default": {"BACKEND": "tests.faults.test_cache_outage.RaisingCache"}}):
        response = Client(raise_request_exception=False).get("/gpus/")
    assert response.status_code == 500
