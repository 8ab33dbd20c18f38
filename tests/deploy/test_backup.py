"""The documented backup procedure. scripts/backup.sh dumps a database holding
leases, ledger entries and a confirmed crypto payment; scripts/restore.sh restores it into
a fresh database, where every row is the same and no migration is missing; it refuses a
database that already has tables."""
import os
import secrets
import subprocess
import sys
import urllib.parse
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.utils import timezone

from billing.models import LedgerEntry, Payment
from billing.payments.services import quote_create
from billing.services import balance_top_up
from rental.models import Lease
from rental.services import account_create
from tests.billing.celery_workers import database_url
from tests.billing.payments_helpers import apply, offline_coins, paid, set_rate
from tests.conftest import ON_POSTGRES
from tests.factories import order
from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
TABLES = ["rental_lease", "rental_leaseevent", "rental_diskkey", "billing_invoice", "billing_ledgerentry",
          "billing_account", "billing_quote", "billing_payment", "auth_user"]
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not ON_POSTGRES, reason="pg_dump backups need DATABASE_URL=postgres://…")]


def business_data(now):
    """Two customers: one paid from the balance, one paid an LTC quote (confirmed)."""
    set_rate("LTC", "100", now)
    alice = account_create(username="backup-alice", password="correct horse battery 9")
    balance_top_up(customer=alice, amount_cents=6500, now=now)
    order(alice, now)
    bob = account_create(username="backup-bob", password="correct horse battery 9")
    _lease, invoice = order(bob, now, pay=False)
    quote = quote_create(invoice=invoice, coin="LTC", now=now)
    apply(quote, [paid(quote, 65 * 1_000_000, 6)], now + timedelta(minutes=5))
    assert Lease.objects.count() == 2 and Payment.objects.filter(state=Payment.State.CONFIRMED).count() == 1
    assert LedgerEntry.objects.count() >= 2


def rows(url, table):
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()


def run(args, **env):
    return subprocess.run(args, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=180)


@pytest.fixture
def fresh_database():
    source = database_url()
    name = f"restore_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(source.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield urllib.parse.urlunsplit(urllib.parse.urlsplit(source)._replace(path=f"/{name}"))
    with psycopg.connect(source.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_backup_restores_into_a_fresh_database_intact(catalog, tmp_path, fresh_database):
    for tool in ("pg_dump", "pg_restore", "psql"):
        require_tool(tool, "apt-get install postgresql-client (scripts/install-deploy-tools.sh)")
    with offline_coins():
        business_data(timezone.now())
    source = database_url()

    backup = run(["scripts/backup.sh"], DATABASE_URL=source, BACKUP_DIR=str(tmp_path))
    assert backup.returncode == 0, backup.stderr
    dump = Path(backup.stdout.strip())
    assert dump.parent == tmp_path and dump.name.startswith("storefront-") and dump.suffix == ".dump"
    assert not list(tmp_path.glob("*.partial"))

    restore = run(["scripts/restore.sh", str(dump), fresh_database])
    assert restore.returncode == 0, restore.stderr
    for table in TABLES:
        original = rows(source, table)
        assert original and rows(fresh_database, table) == original, table

    # The restored schema is complete: nothing for the deploy's migrate step to do.
    check = run([sys.executable, "manage.py", "migrate", "--check"], DATABASE_URL=fresh_database)
    assert check.returncode == 0, check.stdout + check.stderr

    refused = run(["scripts/restore.sh", str(dump), fresh_database])
    assert refused.returncode == 1 and "already has" in refused.stderr and "tables" in refused.stderr
