"""Thin Celery wrappers: re-read state, call a service, record the run."""
from celery import shared_task
from django.utils import timezone

from .lifecycle import run_lifecycle
from .models import JobRun


@shared_task(name="billing.lifecycle_tick", acks_late=True)
def lifecycle_tick() -> int:
    started = timezone.now()
    JobRun.objects.update_or_create(name="lifecycle", defaults={"last_started_at": started})
    results = run_lifecycle(started)
    JobRun.objects.filter(name="lifecycle").update(
        last_finished_at=timezone.now(), last_result={"transitions": len(results)})
    return len(results)
