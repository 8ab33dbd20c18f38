"""The lifecycle tick, Celery's side of the operator's process: one pass every
LIFECYCLE_INTERVAL_SECONDS (settings.CELERY_BEAT_SCHEDULE), recorded in its JobRun row
(billing.jobs, where every scheduled job records its runs).

The task keeps its name, `billing.lifecycle_tick`: the beat schedule sends it by that name,
CELERY_TASK_ROUTES puts `billing.*` on the jobs queue, and a tick already queued during a
deploy must still find its task."""
import logging

from celery import shared_task
from django.utils import timezone

from billing.jobs import LIFECYCLE, job_run_finished, job_run_started

from .lifecycle import SKIPPED, run_lifecycle_exclusive

log = logging.getLogger("ops.tasks")


@shared_task(name="billing.lifecycle_tick", acks_late=True)
def lifecycle_tick() -> int | str:
    """One pass, or SKIPPED when another pass holds the lifecycle lock (JobRun untouched:
    it records the pass that runs)."""
    started = timezone.now()
    results = run_lifecycle_exclusive(started, on_start=_record_start)
    if results is None:
        log.info("lifecycle tick %s", SKIPPED)
        return SKIPPED
    job_run_finished(LIFECYCLE, timezone.now(), {"transitions": len(results)})
    return len(results)


def _record_start(started) -> None:
    job_run_started(LIFECYCLE, started)
