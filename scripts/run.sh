#!/usr/bin/env bash
# The embedded default: SQLite in var/, demo catalog, an operator account, the web server
# and the two Celery workers of production (filesystem broker; Redis when REDIS_URL is set):
# the jobs worker with beat inside it, and the outbound worker (webhook deliveries), so a slow
# webhook receiver cannot stop the demo's lifecycle either.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBUG="${DEBUG:-1}"
# The demo store settles invoices with a "simulate payment" button when no coin is set up.
export DEMO_PAYMENTS="${DEMO_PAYMENTS:-1}"
BIN=.venv/bin
PORT="${PORT:-8000}"

$BIN/python manage.py migrate --noinput
if command -v msgfmt >/dev/null 2>&1; then  # without gettext the committed .mo files serve
  $BIN/python manage.py compilemessages --ignore=.venv --ignore=.chain-tools -v 0
fi
$BIN/python manage.py load_demo
$BIN/python manage.py create_operator

JOBS_QUEUE="${JOBS_QUEUE:-jobs}" OUTBOUND_QUEUE="${OUTBOUND_QUEUE:-outbound}"  # the settings' defaults
$BIN/celery -A storefront worker --beat -Q "$JOBS_QUEUE" -n "$JOBS_QUEUE@%h" --pool=solo --loglevel=INFO \
  --schedule var/celerybeat-schedule >var/celery.log 2>&1 &
CELERY_PID=$!
$BIN/celery -A storefront worker -Q "$OUTBOUND_QUEUE" -n "$OUTBOUND_QUEUE@%h" --pool=solo --loglevel=INFO \
  >var/celery-outbound.log 2>&1 &
OUTBOUND_PID=$!
trap 'kill $CELERY_PID $OUTBOUND_PID 2>/dev/null || true' EXIT INT TERM
echo "Lifecycle jobs: Celery worker + beat (pid $CELERY_PID), log in var/celery.log"
echo "Webhook deliveries: Celery worker (pid $OUTBOUND_PID), log in var/celery-outbound.log"
echo "Storefront: http://127.0.0.1:$PORT/"
$BIN/python manage.py runserver "127.0.0.1:$PORT" --noreload
