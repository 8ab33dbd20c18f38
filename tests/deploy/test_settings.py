"""Production (DEBUG=0) refuses to start without SECRET_KEY, ALLOWED_HOSTS and
a PostgreSQL DATABASE_URL, one line for each; development (DEBUG=1) starts on SQLite with
none of them; PostgreSQL connections get a connect timeout."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_ONLY_ENV = {"TESTING", "DEBUG", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE", "SECRET_KEY",
                 "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"}
COMPLETE = {"SECRET_KEY": "k" * 50, "ALLOWED_HOSTS": "gpus.example.com",
            "DATABASE_URL": "postgres://storefront:pw@db.invalid:5432/storefront"}
SHOW = ("import django; django.setup(); from django.conf import settings as s; "
        "print(s.DATABASES['default']['ENGINE'], s.DATABASES['default'].get('OPTIONS', {}).get('connect_timeout'))")


def settings_import(tmp_path, **env):
    environ = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    environ.update(DJANGO_SETTINGS_MODULE="storefront.settings", VAR_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("missing, line", [
    ("SECRET_KEY", "SECRET_KEY is not set"),
    ("ALLOWED_HOSTS", "ALLOWED_HOSTS is not set"),
    ("DATABASE_URL", "DATABASE_URL is not a PostgreSQL URL"),
])
def test_production_refuses_to_start_without(tmp_path, missing, line):
    env = {k: v for k, v in COMPLETE.items() if k != missing}
    result = settings_import(tmp_path, DEBUG="0", **env)
    assert result.returncode != 0
    errors = [x for x in result.stderr.splitlines() if "is not set" in x or "is not a PostgreSQL" in x]
    assert len(errors) == 1 and errors[0].startswith(line), result.stderr[-2000:]
    assert "ImproperlyConfigured" in result.stderr


def test_production_names_every_missing_variable_at_once(tmp_path):
    result = settings_import(tmp_path, DEBUG="0", DATABASE_URL="sqlite:///db.sqlite3")
    assert result.returncode != 0
    for line in ("SECRET_KEY is not set", "ALLOWED_HOSTS is not set", "DATABASE_URL is not a PostgreSQL URL"):
        assert sum(x.startswith(line) for x in result.stderr.splitlines()) == 1, result.stderr[-2000:]
    assert not (tmp_path / "dev-secret-key").exists()  # no key made up on the side


def test_production_with_everything_set_has_a_connect_timeout(tmp_path):
    result = settings_import(tmp_path, DEBUG="0", DB_CONNECT_TIMEOUT_SECONDS="7", **COMPLETE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.postgresql", "7"]


def test_development_starts_on_sqlite_without_any_of_them(tmp_path):
    result = settings_import(tmp_path, DEBUG="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.sqlite3", "None"]
