#!/usr/bin/env bash
# The whole suite with pytest: SQLite by default; PostgreSQL when DATABASE_URL is set;
# the real-worker Celery tests when REDIS_URL is set; browser tests when Chromium exists.
# Runs on TEST_WORKERS processes (pytest-xdist, default 2: CI's two cores); tests that
# need a machine to themselves (browser, chain daemons, Celery workers) are grouped onto
# one worker by tests/conftest.py. TEST_WORKERS=0 runs everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
if [ -n "${DATABASE_URL:-}" ]; then db="PostgreSQL ($DATABASE_URL)"; else db="SQLite"; fi
workers="${TEST_WORKERS:-2}"
echo "== tests on $db${REDIS_URL:+ with Redis $REDIS_URL}, $workers xdist worker(s)"
if [ "$workers" = "0" ]; then
  $BIN/python -m pytest "$@"
else
  $BIN/python -m pytest -n "$workers" --dist loadgroup "$@"
fi
