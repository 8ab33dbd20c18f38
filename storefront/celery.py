"""Celery app. Broker: Redis when REDIS_URL is set, else a filesystem broker that needs
no server (the embedded default), so `make run` works on a bare machine."""
import os

from celery import Celery
from celery.signals import beat_init, worker_init

from storefront import priority

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")

app = Celery("storefront")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def lower_priority() -> int:
    """At least JOBS_NICENESS for this process: a lifecycle burst on the web's host then waits
    for the requests instead of taking their CPU (docs/performance.md, "The whole store at
    once"; storefront/priority.py). Called before any thread or pool child is started."""
    from django.conf import settings

    return priority.lower_priority(settings.JOBS_NICENESS)


@worker_init.connect
def _worker_lower_priority(**kwargs) -> None:
    lower_priority()


@beat_init.connect
def _beat_lower_priority(**kwargs) -> None:
    lower_priority()
