#!/usr/bin/env bash
# The whole suite with pytest: SQLite by default; PostgreSQL when DATABASE_URL is set;
# the real-worker Celery tests when REDIS_URL is set; browser tests when Chromium exists.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
if [ -n "${DATABASE_URL:-}" ]; then db="PostgreSQL ($DATABASE_URL)"; else db="SQLite"; fi
echo "== tests on $db${REDIS_URL:+ with Redis $REDIS_URL}"
$BIN/python -m pytest "$@"
