"""`manage.py healthcheck web|worker|outbound|beat`: the docker-compose healthchecks, exit 0
when healthy, 1 with one line saying why not. The CI smoke test runs the same commands.

web: GET /healthz on the local web server with the public Host and X-Forwarded-Proto: https,
as the reverse proxy sends it (else Django answers 400 or redirects to https).
worker: the jobs worker on this host answers a ping AND its work is done: the lifecycle pass
and every configured coin's watcher completed a pass recently enough (WORKER_HEALTH_CHECK,
billing/jobs.py). A worker that answers but whose passes stopped is not healthy.
outbound: the outbound worker (webhook deliveries) on this host answers a ping.
beat: the heartbeat file the beat touches on every tick is recent."""
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.module_loading import import_string


def check_web(bind: str) -> str:
    host = next((h for h in settings.ALLOWED_HOSTS if h not in ("*",) and not h.startswith(".")),
                "localhost")
    request = urllib.request.Request(f"http://{bind}/healthz",
                                     headers={"Host": host, "X-Forwarded-Proto": "https"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise CommandError(f"web: /healthz on {bind} as {host} failed: {exc}") from exc
    return f"web: /healthz as {host}: {body}"


def ping(queue: str) -> str:
    """This host's worker of `queue` (scripts/start.sh names each worker after its queue)."""
    from celery import current_app as app  # the project's app (storefront/celery.py)

    node = f"{queue}@{socket.gethostname()}"
    if not app.control.ping(destination=[node], timeout=5.0):
        raise CommandError(f"no ping reply from {node}")
    return f"{node} answered"


def check_worker() -> str:
    try:
        answered = ping(settings.JOBS_QUEUE)
    except CommandError as exc:
        raise CommandError(f"worker: {exc}") from None
    stale, done = import_string(settings.WORKER_HEALTH_CHECK)(timezone.now())
    if stale:
        raise CommandError(f"worker: {answered}, but its work is late: {'; '.join(stale)}")
    return f"worker: {answered}; {'; '.join(done)}"


def check_outbound() -> str:
    try:
        return f"outbound: {ping(settings.OUTBOUND_QUEUE)}"
    except CommandError as exc:
        raise CommandError(f"outbound: {exc}") from None


def check_beat() -> str:
    path = Path(settings.BEAT_HEARTBEAT_FILE)
    if not path.exists():
        raise CommandError(f"beat: no heartbeat at {path} (beat not started yet?)")
    age = time.time() - path.stat().st_mtime
    if age > settings.BEAT_HEARTBEAT_MAX_AGE_SECONDS:
        raise CommandError(f"beat: last tick {age:.0f} s ago "
                           f"(more than BEAT_HEARTBEAT_MAX_AGE_SECONDS={settings.BEAT_HEARTBEAT_MAX_AGE_SECONDS})")
    return f"beat: last tick {age:.0f} s ago"


class Command(BaseCommand):
    help = "Exit 0 when this container's process (web, worker, outbound or beat) is healthy."

    def add_arguments(self, parser):
        parser.add_argument("process", choices=["web", "worker", "outbound", "beat"])
        parser.add_argument("--bind", default=os.environ.get("HEALTHCHECK_BIND", "127.0.0.1:8000"),
                            help="host:port of the web server (web only)")

    def handle(self, *args, process, bind, **options):
        checks = {"web": lambda: check_web(bind), "worker": check_worker, "outbound": check_outbound,
                  "beat": check_beat}
        self.stdout.write(checks[process]())
