"""Thin Celery wrappers: re-read state, call a service, record the run."""
import logging

from celery import shared_task
from django.utils import timezone

from .lifecycle import SKIPPED, run_lifecycle_exclusive
from .models import JobRun

log = logging.getLogger("billing.tasks")


@shared_task(name="billing.lifecycle_tick", acks_late=True)
def lifecycle_tick() -> int | str:
    """One pass, or SKIPPED when another pass holds the lifecycle lock (JobRun untouched:
    it records the pass that runs)."""
    started = timezone.now()
    results = run_lifecycle_exclusive(started, on_start=_record_start)
    if results is None:
        log.info("lifecycle tick %s", SKIPPED)
        return SKIPPED
    JobRun.objects.filter(name="lifecycle").update(
        last_finished_at=timezone.now(), last_result={"transitions": len(results)})
    return len(results)


def _record_start(started) -> None:
    JobRun.objects.update_or_create(name="lifecycle", defaults={"last_started_at": started})


@shared_task(name="billing.watch_coin", acks_late=True)
def watch_coin(coin: str) -> int:
    """One watcher pass for one coin; returns how many quotes it touched."""
    from .payments.services import watch_coin as watch

    return len(watch(coin=coin, now=timezone.now()).quotes)


@shared_task(name="billing.watch_payments", acks_late=True)
def watch_payments(coins: list[str] | None = None) -> dict[str, int | str]:
    """One pass over every configured coin (or ``coins``); a coin whose node is down is
    reported and skipped, the others still run. Records the run in JobRun."""
    from .payments.services import coins_watched
    from .payments.services import watch_coin as watch

    started = timezone.now()
    JobRun.objects.update_or_create(name="watch_payments", defaults={"last_started_at": started})
    result: dict[str, int | str] = {}
    for coin in coins or [str(c) for c in coins_watched()]:
        try:
            result[coin] = len(watch(coin=coin, now=timezone.now()).quotes)
        except Exception as exc:  # one coin's node being down must not stop the others
            log.exception("%s watcher pass failed", coin)
            result[coin] = f"error: {exc.__class__.__name__}: {exc}"[:200]
    JobRun.objects.filter(name="watch_payments").update(last_finished_at=timezone.now(), last_result=result)
    return result


@shared_task(name="billing.refresh_rates", acks_late=True)
def refresh_rates() -> dict[str, str]:
    """Coin rates from the operator's price sources (median), recorded in JobRun."""
    from .payments.pricing import rates_refresh
    from .payments.services import coins_watched

    started = timezone.now()
    JobRun.objects.update_or_create(name="refresh_rates", defaults={"last_started_at": started})
    result = rates_refresh(coins=coins_watched(), now=started)
    JobRun.objects.filter(name="refresh_rates").update(last_finished_at=timezone.now(), last_result=result)
    return result
