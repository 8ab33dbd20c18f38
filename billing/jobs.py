"""When each scheduled job last completed a pass, and whether that is recent enough: one rule
for the jobs worker's healthcheck (`manage.py healthcheck worker`, through WORKER_HEALTH_CHECK)
and the operators' dashboard. A worker that answers pings but whose passes stopped (stuck
behind something, its queue unread) is unhealthy, because the work is not being done.

Each pass writes its own JobRun row when it completes: the lifecycle tick, the watchers' pass
over every coin, and one row per coin (`watch_payments:<coin>`), so one coin's watcher that
stopped shows even while the others run. A coin's pass that reached its node's error counts as
completed: the node's failure is the coin's health (the dashboard's "coin unwell", and the coin
is not offered), not the worker's."""
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from .models import JobRun

LIFECYCLE = "lifecycle"
WATCH_PAYMENTS = "watch_payments"


def coin_job(coin) -> str:
    """The JobRun row of one coin's watcher."""
    return f"{WATCH_PAYMENTS}:{coin}"


def job_run_started(name: str, started: datetime) -> None:
    JobRun.objects.update_or_create(name=name, defaults={"last_started_at": started})


def job_run_finished(name: str, finished: datetime, result: dict) -> None:
    JobRun.objects.filter(name=name).update(last_finished_at=finished, last_result=result)


def job_run_record(name: str, started: datetime, finished: datetime, result: dict) -> None:
    JobRun.objects.update_or_create(name=name, defaults={"last_started_at": started, "last_finished_at": finished,
                                                         "last_result": result})


def interval(name: str) -> timedelta | None:
    """A job's beat interval (a coin's watcher has its watchers' pass's), None if not scheduled."""
    entry = settings.CELERY_BEAT_SCHEDULE.get(name.split(":", 1)[0])
    schedule = entry and entry.get("schedule")
    if isinstance(schedule, timedelta):
        return schedule
    return timedelta(seconds=schedule) if isinstance(schedule, int | float) else None


def allowed_staleness(name: str) -> timedelta | None:
    """How old a job's last completed pass may be: JOB_STALE_AFTER_INTERVALS of its interval."""
    every = interval(name)
    return every * settings.JOB_STALE_AFTER_INTERVALS if every else None


@dataclass
class Freshness:
    name: str
    last_finished_at: datetime | None
    age: timedelta | None   # since the last completed pass; None: never completed
    allowed: timedelta | None

    @property
    def stale(self) -> bool:
        return self.allowed is not None and (self.age is None or self.age > self.allowed)

    def describe(self) -> str:
        allowed = f"allowed {seconds(self.allowed)}" if self.allowed else "not scheduled"
        if self.age is None:
            return f"{self.name}: never completed ({allowed})"
        return f"{self.name}: last completed {seconds(self.age)} ago ({allowed})"


def seconds(delta: timedelta) -> str:
    return f"{delta.total_seconds():.0f} s"


def freshness(name: str, now: datetime, last_finished_at: datetime | None) -> Freshness:
    return Freshness(name=name, last_finished_at=last_finished_at,
                     age=now - last_finished_at if last_finished_at else None, allowed=allowed_staleness(name))


def watched_names() -> list[str]:
    """What the jobs worker must keep doing: the lifecycle pass and each configured coin's watcher."""
    from .payments.services import coins_watched

    return [LIFECYCLE] + [coin_job(coin) for coin in coins_watched()]


def watched_jobs(now: datetime) -> list[Freshness]:
    names = watched_names()
    finished = dict(JobRun.objects.filter(name__in=names).values_list("name", "last_finished_at"))
    return [freshness(name, now, finished.get(name)) for name in names]


def stale_jobs(now: datetime) -> tuple[list[str], list[str]]:
    """(why the jobs worker is unhealthy, what it did): one line per stale job, naming it,
    and one line per job."""
    jobs = watched_jobs(now)
    return [j.describe() for j in jobs if j.stale], [j.describe() for j in jobs]
