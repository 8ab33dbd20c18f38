"""tests/deadlines.py: a deadline is a budget of unloaded seconds, spent more slowly on a busy
machine, bounded however busy, and a dead process fails the wait at once."""
import subprocess
import sys

import pytest

from tests import deadlines


@pytest.fixture
def load(monkeypatch):
    """Set the 1-minute load average per core that the deadlines read."""
    monkeypatch.delenv("TEST_DEADLINE_FACTOR", raising=False)
    monkeypatch.setattr(deadlines.os, "cpu_count", lambda: 2)

    def set_per_core(per_core: float) -> None:
        monkeypatch.setattr(deadlines.os, "getloadavg", lambda: (per_core * 2, 0.0, 0.0))
    return set_per_core


class Clock:
    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr(deadlines.time, "monotonic", lambda: self.now)


@pytest.mark.parametrize(("per_core", "factor"), [(0.2, 1.0), (1.0, 1.0), (1.5, 1.5), (3.0, 3.0), (50.0, 6.0)])
def test_the_load_factor_is_the_load_per_core_between_one_and_the_cap(load, per_core, factor):
    load(per_core)
    assert deadlines.load_factor() == factor
    assert deadlines.scaled(10) == 10 * factor


def test_a_budget_is_spent_more_slowly_while_the_machine_is_busy(load, monkeypatch):
    clock = Clock(monkeypatch)
    load(1.0)
    deadline = deadlines.Deadline(10)
    clock.now += 9
    assert not deadline.expired()
    load(2.0)  # twice as busy: the last second of budget lasts two
    clock.now += 1.5
    assert not deadline.expired()
    clock.now += 0.6
    assert deadline.expired()


def test_test_deadline_factor_stretches_every_budget(load, monkeypatch):
    load(1.0)
    monkeypatch.setenv("TEST_DEADLINE_FACTOR", "2.5")
    assert deadlines.scaled(4) == 10


def test_wait_for_returns_the_condition_s_value_and_names_what_timed_out(load, monkeypatch):
    load(1.0)
    answers = iter([0, None, "up"])
    assert deadlines.wait_for(lambda: next(answers), 5, "the daemon", every=0) == "up"

    with pytest.raises(AssertionError, match=r"waiting for the never-true thing; last error: .*not yet.*\nthe log tail"):
        deadlines.wait_for(lambda: (_ for _ in ()).throw(OSError("not yet")), 0.05, "the never-true thing",
                           every=0.01, ignore=(OSError,), detail=lambda: "the log tail")


def test_a_process_that_exits_fails_the_wait_at_once(load):
    load(1.0)
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(AssertionError, match="exited with 3 while waiting for the server"):
        deadlines.wait_for(lambda: False, 3600, "the server", alive=[proc])
