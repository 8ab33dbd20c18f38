"""Celery app. Broker: Redis when REDIS_URL is set, else a filesystem broker that needs
no server (the embedded default), so `make run` works on a bare machine."""
import os
from pathlib import Path

from celery import Celery
from celery.signals import beat_init, worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")

app = Celery("storefront")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def lower_priority() -> int:
    """At least JOBS_NICENESS for this process: a lifecycle burst on the web's host then waits
    for the requests instead of taking their CPU (docs/performance.md, "The whole store at
    once"). Raised, never lowered, and only once however often it is called; returns the
    niceness. Called before any thread or pool child is started (Linux keeps a niceness per
    thread; children and threads inherit it)."""
    from django.conf import settings

    current = os.getpriority(os.PRIO_PROCESS, 0)
    if settings.JOBS_NICENESS > current:
        os.setpriority(os.PRIO_PROCESS, 0, settings.JOBS_NICENESS)
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    _lower_own_session(niceness)
    return niceness


AUTOGROUP = Path("/proc/self/autogroup")


def _lower_own_session(niceness: int) -> None:
    """Linux's autogroup (kernel.sched_autogroup_enabled) shares the CPU between sessions
    first and by niceness only within one: a jobs process that leads a session of its own (a
    supervisor's setsid) would, niced alone, still take a whole session's share beside the
    web's. Its session's group takes the niceness too, only when this process leads it: a
    session shared with the web is left alone, as niceness already works within it."""
    if os.getsid(0) != os.getpid():
        return
    try:
        group = int(AUTOGROUP.read_text().split()[-1])      # "/autogroup-113 nice 0"
        if niceness > group:
            AUTOGROUP.write_text(str(niceness))
    except (OSError, ValueError, IndexError):   # no autogroup in this kernel, or not Linux
        return


@worker_init.connect
def _worker_lower_priority(**kwargs) -> None:
    lower_priority()


@beat_init.connect
def _beat_lower_priority(**kwargs) -> None:
    lower_priority()
