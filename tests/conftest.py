import os

import pytest

from inventory.demo import load_demo_catalog
from rental.demo import load_demo_images
from tests.tools import require

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
HAS_REDIS = bool(os.environ.get("REDIS_URL"))


def pytest_runtest_setup(item):
    """`postgres` and `redis` tests skip on SQLite (CI runs them in its second pass, on
    PostgreSQL + Redis). In a PostgreSQL pass a `redis` test without REDIS_URL is a missing
    tool: skipped locally, failed under CI=true (tests/tools.py)."""
    needs_redis = item.get_closest_marker("redis") is not None
    if (needs_redis or item.get_closest_marker("postgres")) and not ON_POSTGRES:
        pytest.skip("needs DATABASE_URL=postgres://… (CI's PostgreSQL pass runs it)")
    if needs_redis:
        require(HAS_REDIS, "REDIS_URL is not set: this test needs Redis and a real Celery worker")


@pytest.fixture
def catalog(db):
    """The demo catalog from SPEC.md's figures, with the demo images."""
    load_demo_catalog()
    load_demo_images()


@pytest.fixture
def customer(db):
    from rental.services import account_create

    return account_create(username="alice", password="correct horse battery 9", email="alice@example.org")


@pytest.fixture
def other_customer(db):
    from rental.services import account_create

    return account_create(username="bob", password="correct horse battery 9")


@pytest.fixture
def operator(db, django_user_model):
    return django_user_model.objects.create_superuser(username="op", password="operator pass 12345")
