import os
import uuid
from pathlib import Path

import pytest
from celery import Celery

from inventory.demo import load_demo_catalog
from rental.demo import load_demo_images
from tests.timing import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401 - hooks: where the run's time went
from tests.tools import require

ON_POSTGRES = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
HAS_REDIS = bool(os.environ.get("REDIS_URL"))
TESTS = Path(__file__).resolve().parent

if ON_POSTGRES:
    from tests import db_flush

    db_flush.install()  # transactional tests end with DELETE, not a TRUNCATE of every table


# Tests that must not run twice at once on a 2-core machine share one xdist worker
# (`--dist loadgroup` in scripts/test.sh): one chromium, one set of chain daemons, one set
# of real Celery workers, instead of one per xdist worker competing for the same cores.
XDIST_GROUPS = {"browser": {"browser", "new_context", "shop"},
                "chains": {"litecoind", "anvil", "monero_regtest"},
                "celery-workers": {"queue", "scan_queue"},
                "ceph": {"ceph_cluster", "ceph_cluster_running"},  # one test cluster
                "qemu-guest": {"guest"},  # the disk guest's module fixture boots once, on one worker
                # the production stack (Caddy, granian, Celery, beat) boots once, not once per worker
                "production-stack": {"stack"}}


# Tests that stand up real infrastructure (a node with dockerd, a QEMU guest, a Ceph
# cluster, the benchmarks' own servers) are marked `infra`: CI runs them once, in its
# PostgreSQL pass — the storefront production runs on — not again on SQLite (.ci/run).
INFRA_DIRS = ("nodeagent", "storage", "bench")
# Tests that drive real daemons (regtest chains, Chromium) are marked `daemons`: they touch the
# database like any page, and CI runs them once, in its PostgreSQL pass, rather than twice.
DAEMON_GROUPS = ("chains", "browser")


# tryfirst: xdist's own hook turns the xdist_group marks into the node ids' "@group" suffix, so
# ours must have added them before it runs (without it, every group was silently split).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).relative_to(TESTS).parts[0] in INFRA_DIRS:
            item.add_marker(pytest.mark.infra)
        for group, fixtures in XDIST_GROUPS.items():
            if fixtures & set(getattr(item, "fixturenames", ())):
                item.add_marker(pytest.mark.xdist_group(group))
                if group in DAEMON_GROUPS:
                    item.add_marker(pytest.mark.daemons)
                break
    if os.environ.get(SKIP_DATABASE_FREE):
        _deselect_database_free(config, items)


#: Set by .ci/run for its PostgreSQL pass: the tests that touch no database (the VRAM engine,
#: the coins' address derivation, the lint rules, the docs' links…) ran in the SQLite pass and
#: would run the same again; only the ones that need the database, Redis or infrastructure run.
SKIP_DATABASE_FREE = "TEST_SKIP_DATABASE_FREE"
DATABASE_FIXTURES = {"db", "transactional_db", "live_server", "django_db_reset_sequences",
                     "django_db_serialized_rollback"}


def database_free(item) -> bool:
    if any(item.get_closest_marker(m) for m in ("django_db", "infra", "daemons", "node_box", "redis", "postgres")):
        return False
    return not DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))


def _deselect_database_free(config, items):
    kept, dropped = [], []
    for item in items:
        (dropped if database_free(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


MISGROUPED = ("pytest-xdist ignored this test's xdist_group: grouped tests would be spread over every "
              "worker (two chromiums, chain sets or Ceph clusters on CI's two cores). Check the pytest and "
              "pytest-xdist pins and the order of tests/conftest.py's hooks.")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Under `--dist loadgroup` a grouped test's node id ends in "@group" (xdist's own hook adds
    it). Grouping failed silently twice (this file's hook running after xdist's; pytest 9.2
    ignoring xdist's node id change), so a test whose suffix is missing now fails, saying why."""
    if not session.config.getoption("loadgroup", False):  # set on xdist's workers only
        return
    for item in session.items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})  # several: xdist joins them with "_"
        if names and not item.nodeid.endswith("@" + "_".join(names)):
            item.add_marker(pytest.mark.xdist_misgrouped)


def pytest_runtest_setup(item):
    """`postgres` and `redis` tests skip on SQLite (CI runs them in its second pass, on
    PostgreSQL + Redis). In a PostgreSQL pass a `redis` test without REDIS_URL is a missing
    tool: skipped locally, failed under CI=true (tests/tools.py)."""
    if item.get_closest_marker("xdist_misgrouped"):
        pytest.fail(MISGROUPED, pytrace=False)
    needs_redis = item.get_closest_marker("redis") is not None
    if (needs_redis or item.get_closest_marker("postgres")) and not ON_POSTGRES:
        pytest.skip("needs DATABASE_URL=postgres://… (CI's PostgreSQL pass runs it)")
    if needs_redis:
        require(HAS_REDIS, "REDIS_URL is not set: this test needs Redis and a real Celery worker")


@pytest.fixture(autouse=True)
def _fresh_throttles():
    """Throttles count per user id too, and a rolled-back test's ids come back in
    the next test (SQLite): every test starts with empty counters."""
    from django.core.cache import cache

    from rental.accounts.throttle import _RESERVATIONS

    cache.clear()
    _RESERVATIONS.held.clear()  # this process's reserved uses of the counters just cleared


@pytest.fixture(autouse=True)
def _storefront_celery_app_stays_current():
    """A Celery app made in a test becomes the current one by default, and the storefront's
    shared tasks then queue through it (to Redis, never eagerly) in every later test on the
    same xdist worker: the webhook tests failed only after the Celery worker tests."""
    from celery import current_app

    from storefront import celery_app

    yield
    assert current_app._get_current_object() is celery_app, \
        "this test left another Celery app current: make it with set_as_current=False"


@pytest.fixture(autouse=True)
def _default_language():
    """A request served in Chinese leaves zh-hans active in the worker thread (Django's
    LocaleMiddleware activates and never deactivates it); every test starts in the site's
    default language, whichever test ran before it on the same xdist worker."""
    from django.conf import settings
    from django.utils import translation

    translation.activate(settings.LANGUAGE_CODE)
    yield
    translation.activate(settings.LANGUAGE_CODE)


@pytest.fixture
def catalog(db):
    """The demo catalog from SPEC.md's figures, with the demo images."""
    load_demo_catalog()
    load_demo_images()


@pytest.fixture
def t0():
    """Now, to the second: the moment a test's history starts (tests/ops starts two months back)."""
    from django.utils import timezone

    return timezone.now().replace(microsecond=0)


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
    """A superuser with an authenticator: staff must enrol TOTP."""
    from tests.otp import authenticator_for

    user = django_user_model.objects.create_superuser(username="op", password="operator pass 12345")
    authenticator_for(user)
    return user


@pytest.fixture
def client():
    """Django's test client whose force_login also passes the two-factor step (tests/otp.py)."""
    from tests.otp import TwoFactorClient

    return TwoFactorClient()


# The real Celery workers' tests (tests/billing/celery_workers.py; the celery-workers group)
@pytest.fixture
def queue():
    """A queue of our own on the shared Redis database, so parallel runs never meet."""
    name = f"lifecycle-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # not the current app: the storefront's tasks queued later in this process (eager in tests) must
    # not be sent through this sender to a queue no worker reads
    app = Celery("test-sender", broker=os.environ["REDIS_URL"], set_as_current=False)
    yield name, app
    with app.connection_for_write() as conn:
        conn.default_channel.client.delete(name)
    app.close()
