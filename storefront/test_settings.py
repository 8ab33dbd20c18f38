"""Settings for the test suite: the same as production's shape, with fast hashing,
eager Celery (unless a test starts a real worker) and no SSL redirect."""
import os

os.environ.setdefault("TESTING", "1")

from .settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed only; prod uses Argon2

# pytest-xdist runs two workers against one Redis: tests that clear the cache (throttles,
# page caches) must not flush the other worker's keys in the middle of its test, so each
# worker's cache gets its own Redis database (the broker and locks keep REDIS_URL's).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and CACHES["default"]["BACKEND"] == "core.cache.FailOpenRedisCache":  # noqa: F405
    from urllib.parse import urlsplit, urlunsplit

    _url = urlsplit(CACHES["default"]["LOCATION"])  # noqa: F405
    _base = int(_url.path.strip("/") or 0)
    _db = (_base - 1 - int(_worker[2:])) % 16
    CACHES["default"]["LOCATION"] = urlunsplit(_url._replace(path=f"/{_db}"))  # noqa: F405

# The burn-in gate (inventory.burnin) is off for the suite's many enrol-then-order tests,
# whose nodes have no diagnostic; tests/fleet/test_burn_in.py and the agent's end-to-end
# burn-in test turn it on and drive it through the real agent.
BURN_IN_BEFORE_SALE = False
