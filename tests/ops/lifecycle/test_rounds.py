"""A pass runs its sweeps in rounds of one batch each, so a burst of due work of one
kind cannot spend the pass budget while another kind waits for the next pass."""
import itertools

import pytest
from django.utils import timezone

from ops import lifecycle
from rental.lifecycle import Transition


def due_work(name: str, count: int, done: list[str]):
    """A sweep with `count` due rows that takes at most `limit` of them per batch."""
    left = [count]

    def sweep(now, limit):
        batch = min(limit, left[0])
        left[0] -= batch
        done.extend([name] * batch)
        return [Transition(i, name) for i in range(batch)]
    return sweep


@pytest.fixture
def one_second_per_clock_read(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(lifecycle.time, "monotonic", lambda: float(next(ticks)))


@pytest.mark.django_db
def test_a_burst_of_one_kind_does_not_starve_the_next_sweep(settings, one_second_per_clock_read):
    settings.LIFECYCLE_BATCH, settings.LIFECYCLE_PASS_BUDGET_SECONDS = 10, 3
    done: list[str] = []
    sweeps = [("reminders", due_work("reminders", 1000, done)), ("suspend", due_work("suspend", 1000, done))]
    lifecycle._run_sweeps(timezone.now(), sweeps)
    # the clock is read once per round: three rounds fit the budget, each a batch of both kinds
    assert done.count("reminders") == done.count("suspend") == 30
    assert done[:20] == ["reminders"] * 10 + ["suspend"] * 10   # dependency order inside a round


@pytest.mark.django_db
def test_a_pass_ends_when_every_sweep_came_back_short(settings):
    settings.LIFECYCLE_BATCH, settings.LIFECYCLE_PASS_BUDGET_SECONDS = 10, 60
    done: list[str] = []
    sweeps = [("renewals", due_work("renewals", 25, done)), ("release", due_work("release", 4, done))]
    results = lifecycle._run_sweeps(timezone.now(), sweeps)
    assert (done.count("renewals"), done.count("release")) == (25, 4)
    assert [name for name, _ in results].count("renewals") == 25
