import os

import pytest

from inventory.demo import load_demo_catalog
from rental.demo import load_demo_images

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
HAS_REDIS = bool(os.environ.get("REDIS_URL"))


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
    """A superuser with an authenticator: staff must enrol TOTP (issue 16)."""
    from tests.otp import authenticator_for

    user = django_user_model.objects.create_superuser(username="op", password="operator pass 12345")
    authenticator_for(user)
    return user


@pytest.fixture
def client():
    """Django's test client whose force_login also passes the two-factor step (tests/otp.py)."""
    from tests.otp import TwoFactorClient

    return TwoFactorClient()
