#!/usr/bin/env bash
# The processes of the production stack, shared by docker-compose.yml (each service's
# command) and the CI smoke test (tests/deploy/), so both start them the same way:
#   start.sh migrate   one-shot: deploy checks, then database migrations (every upgrade)
#   start.sh web       gunicorn behind the reverse proxy (Caddyfile)
#   start.sh worker    the Celery worker
#   start.sh beat      the one Celery beat (heartbeat for its healthcheck: rental/beat.py)
# Settings come from the environment (.env.example); static files and catalogs are already
# in the image (scripts/build-assets.sh), so nothing here writes outside VAR_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-storefront.settings}"

case "${1:-}" in
  migrate)
    python manage.py check --deploy
    exec python manage.py migrate --noinput ;;
  web)
    # issue 28: the client's address and no reset token in the access log
    # (rental/accesslog.py); no control socket: nothing but the master manages workers.
    # WEB_THREADS > 1 runs gunicorn's threaded worker (keep-alive to the proxy): issue 31
    # measured it for a storefront serving a large fleet of node agents (BENCHMARKS.md §11).
    exec gunicorn storefront.wsgi:application --bind "${GUNICORN_BIND:-0.0.0.0:8000}" \
      --workers "${WEB_CONCURRENCY:-4}" --threads "${WEB_THREADS:-1}" --worker-tmp-dir /dev/shm --access-logfile - \
      --logger-class rental.accesslog.AccessLogger \
      --access-logformat '%(h)s via %({peer}e)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"' \
      --no-control-socket ;;
  worker)
    exec celery -A storefront worker --loglevel=INFO --concurrency="${CELERY_CONCURRENCY:-4}" ;;
  beat)
    exec celery -A storefront beat --loglevel=INFO ;;
  *)
    echo "usage: $0 migrate|web|worker|beat" >&2
    exit 2 ;;
esac
