import os

import pytest

from inventory.demo import load_demo_catalog

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
HAS_REDIS = bool(os.environ.get("REDIS_URL"))


@pytest.fixture
def catalog(db):
    """The demo catalog from SPEC.md's figures."""
    load_demo_catalog()


@pytest.fixture
def customer(db, django_user_model):
    return django_user_model.objects.create_user(username="alice", password="correct horse battery 9")


@pytest.fixture
def other_customer(db, django_user_model):
    return django_user_model.objects.create_user(username="bob", password="correct horse battery 9")


@pytest.fixture
def operator(db, django_user_model):
    return django_user_model.objects.create_superuser(username="op", password="operator pass 12345")
