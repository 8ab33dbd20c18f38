"""Thin Celery wrappers: re-read state, call a service, record the run (billing.jobs). The
lifecycle tick is the operator's process's: ops/tasks.py."""
import logging

from celery import shared_task
from django.utils import timezone

from .jobs import (
    WATCH_PAYMENTS,
    coin_job,
    job_run_finished,
    job_run_record,
    job_run_started,
)

log = logging.getLogger("billing.tasks")


@shared_task(name="billing.watch_coin", acks_late=True)
def watch_coin(coin: str) -> int:
    """One watcher pass for one coin; returns how many quotes it touched."""
    return _watch_one(coin)


def _watch_one(coin: str) -> int:
    """One coin's pass, recorded in its own JobRun row when it completes (the healthcheck's
    and the dashboard's age of that coin's watcher), even when its node failed."""
    from .payments.services import watch_coin as watch

    started = timezone.now()
    try:
        touched = len(watch(coin=coin, now=started).quotes)
    except Exception as exc:
        job_run_record(coin_job(coin), started, timezone.now(), {"error": f"{exc.__class__.__name__}: {exc}"[:200]})
        raise
    job_run_record(coin_job(coin), started, timezone.now(), {"quotes": touched})
    return touched


@shared_task(name="billing.watch_payments", acks_late=True)
def watch_payments(coins: list[str] | None = None) -> dict[str, int | str]:
    """One pass over every configured coin (or ``coins``); a coin whose node is down is
    reported and skipped, the others still run. Records the run in JobRun."""
    from .payments.services import coins_watched

    job_run_started(WATCH_PAYMENTS, timezone.now())
    result: dict[str, int | str] = {}
    for coin in coins or [str(c) for c in coins_watched()]:
        try:
            result[coin] = _watch_one(coin)
        except Exception as exc:  # one coin's node being down must not stop the others
            log.exception("%s watcher pass failed", coin)
            result[coin] = f"error: {exc.__class__.__name__}: {exc}"[:200]
    job_run_finished(WATCH_PAYMENTS, timezone.now(), result)
    return result


@shared_task(name="billing.refresh_rates", acks_late=True)
def refresh_rates() -> dict[str, str]:
    """Coin rates from the operator's price sources (median), recorded in JobRun."""
    from .payments.pricing import rates_refresh
    from .payments.services import coins_watched

    started = timezone.now()
    job_run_started("refresh_rates", started)
    result = rates_refresh(coins=coins_watched(), now=started)
    job_run_finished("refresh_rates", timezone.now(), result)
    return result
