"""Fleet's periodic jobs (the beat schedule in storefront/settings): the idle-GPU notice."""
from celery import shared_task
from django.utils import timezone

from billing.jobs import job_run_record

from .idle import sweep_idle_notices

IDLE_NOTICES = "idle_notices"     # the beat schedule's name, and the JobRun's


@shared_task(name="fleet.idle_notices", acks_late=True)
def idle_notices() -> int:
    started = timezone.now()
    sent = sweep_idle_notices(started)
    job_run_record(IDLE_NOTICES, started, timezone.now(), {"sent": len(sent)})
    return len(sent)
