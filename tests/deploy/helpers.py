"""Running the production settings in tests: the environment only tests may set, a free port, a Redis database of its own,
the command line of a service."""
import os
import socket
import urllib.parse
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


TEST_ONLY_ENV = {"TESTING", "DEBUG", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE",
                 "CELERY_TASK_ALWAYS_EAGER"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Redis databases that processes started by a test own. REDIS_URL's database is the shared
#: broker's and the started processes' by default, and each xdist worker's in-process cache
#: takes one counting down from the one below it (storefront/test_settings.py: 14, 13, 12 for
#: CI's 15 and three workers). On a shared database a node's watch in a started stack woke for
#: another stack's or a bench's change (a new fleet-wide epoch when it saved an offer), and one
#: stack's Celery worker could take another's lifecycle tasks (the same queue names) and run
#: them against its own database.
STACK_REDIS_DATABASES = range(1, 9)    # one per xdist worker: each builds at most one stack at a time
BENCH_REDIS_DATABASE = 9               # the bench smoke tests (one xdist group)


def own_redis_url(database: int) -> str:
    """REDIS_URL's server, on `database`, emptied first."""
    import redis
    parts = urllib.parse.urlsplit(os.environ["REDIS_URL"])
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))
    redis.Redis.from_url(url).flushdb()
    return url


def stack_redis_database() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    return STACK_REDIS_DATABASES[int(worker) % len(STACK_REDIS_DATABASES) if worker.isdigit() else 0]


def service_command(service: str) -> list[str]:
    return COMPOSE["services"][service]["command"]
