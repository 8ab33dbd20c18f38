#!/usr/bin/env bash
# The processes of the production stack, shared by docker-compose.yml (each service's
# command) and the CI smoke test (tests/deploy/), so both start them the same way:
#   start.sh migrate   one-shot: deploy checks, then database migrations (every upgrade)
#   start.sh web       granian behind the reverse proxy (Caddyfile)
#   start.sh watch     granian (ASGI) for the nodes' long waits on /agent/v1/desired/watch only
#   start.sh worker    the Celery worker of the jobs queue: the lifecycle pass, the payment watchers
#   start.sh outbound  the Celery worker of the outbound queue: calls to customers' addresses (webhooks)
#   start.sh beat      the one Celery beat (heartbeat for its healthcheck: storefront/beat.py)
# Each worker reads its own queue (CELERY_TASK_ROUTES in storefront/settings/) and is named after
# it, which is the name its healthcheck pings: a slow customer endpoint can fill the outbound
# worker's slots, never the jobs worker's. The watch, the workers and beat lower their own priority
# as they start (WATCH_NICENESS, JOBS_NICENESS; storefront/priority.py): on a shared host the
# customers' requests take the CPU first, then the nodes', then the background jobs.
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
    # Granian (docs/adr/0019; HTTP in Rust; the app on WEB_THREADS Python threads per worker) serves
    # a fleet's polls at ~1.5 ms of a worker's CPU each, where gunicorn's threaded worker took
    # 2.3-3.0 ms: 10,000 nodes at a 15 s poll fit a 2-core machine (docs/performance.md, "Fleet scale").
    # The access log is the application's (storefront.wsgi:served,
    # storefront/accesslog.py: the client's address, no reset token), so the server's is off;
    # no control socket: nothing but the main process manages workers.
    bind="${WEB_BIND:-0.0.0.0:8000}"
    exec granian --interface wsgi storefront.wsgi:served --host "${bind%:*}" --port "${bind##*:}" \
      --workers "${WEB_CONCURRENCY:-$(nproc)}" --blocking-threads "${WEB_THREADS:-2}" \
      --no-access-log --log-level warning --respawn-failed-workers ;;
  watch)
    # A node waits here for a change to its desired state (fleet/desired_watch.py): one
    # coroutine per waiting node, no thread, so a fleet's waits cost memory, not CPU. The
    # reverse proxy sends only those paths here: the watch and the report that waits
    # (Caddyfile, WATCH_UPSTREAM). The reports are the fleet's work, so it has a worker per
    # CPU as the web has: one worker (one GIL) answered late past ~4,000 nodes at a 15 s poll;
    # with two, 5,000 nodes' answers came within 146 ms p99 (ADR 0028).
    # granian takes at most --backpressure requests at once per worker (default: backlog/workers,
    # 1,024): every waiting node is one, so it is sized for the fleet (WATCH_MAX_WAITING).
    # It yields the CPU to the web's requests and takes it before the jobs (WATCH_NICENESS,
    # storefront/priority.py): a node's report has seconds to spare, a customer's page not.
    bind="${WATCH_BIND:-0.0.0.0:8001}"
    exec python -m storefront.priority WATCH_NICENESS \
      granian --interface asgi storefront.asgi:application --host "${bind%:*}" --port "${bind##*:}" \
      --workers "${WATCH_CONCURRENCY:-$(nproc)}" --backlog 4096 --backpressure "${WATCH_MAX_WAITING:-20000}" \
      --no-access-log --log-level warning --respawn-failed-workers ;;
  worker)
    queue="${JOBS_QUEUE:-jobs}"
    exec celery -A storefront worker -Q "$queue" -n "$queue@%h" --loglevel=INFO \
      --concurrency="${CELERY_CONCURRENCY:-4}" ;;
  outbound)
    # Attempts mostly wait on the network, each at most WEBHOOK_ATTEMPT_DEADLINE_SECONDS and at
    # most WEBHOOK_CONCURRENCY_PER_ACCOUNT per customer at once: more slots than the jobs worker.
    queue="${OUTBOUND_QUEUE:-outbound}"
    exec celery -A storefront worker -Q "$queue" -n "$queue@%h" --loglevel=INFO \
      --concurrency="${OUTBOUND_CONCURRENCY:-8}" ;;
  beat)
    exec celery -A storefront beat --loglevel=INFO ;;
  *)
    echo "usage: $0 migrate|web|watch|worker|outbound|beat" >&2
    exit 2 ;;
esac
