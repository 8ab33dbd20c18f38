"""The background processes yield the CPU to requests (storefront/celery.py, JOBS_NICENESS):
Celery's worker and beat raise their niceness when they start, once however often asked,
and never lower one they were started with. Each case runs in a process of its own: a
niceness once raised cannot be lowered again without privileges."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storefront.priority import AUTOGROUP
from tests.tools import require

BASE = Path(__file__).resolve().parents[2]
PROBE = """
import os, django
django.setup()
from celery.signals import beat_init, worker_init
from storefront.celery import lower_priority
{body}
"""


def niceness_after(body: str, jobs_niceness: str, start_at: int = 0) -> list[int]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "JOBS_NICENESS": jobs_niceness}
    out = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], cwd=BASE, env=env, check=True,
                         capture_output=True, text=True, timeout=120,
                         preexec_fn=(lambda: os.nice(start_at)) if start_at else None)
    return [int(x) for x in out.stdout.split()]


def start() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.parametrize("signal", ["worker_init", "beat_init"])
def test_a_worker_or_beat_starting_takes_the_jobs_niceness(signal):
    assert niceness_after(f"{signal}.send(sender=None); print(os.getpriority(os.PRIO_PROCESS, 0))",
                          "7") == [max(start(), 7)]


def test_asked_twice_it_is_raised_once():
    assert niceness_after("print(lower_priority(), lower_priority())", "7") == [max(start(), 7)] * 2


def test_a_higher_niceness_it_was_started_with_is_kept():
    assert niceness_after("print(lower_priority())", "3", start_at=12 - start()) == [12]


def test_zero_leaves_it_as_started():
    assert niceness_after("print(lower_priority())", "0") == [start()]


def autogroup_after(body: str, jobs_niceness: str, *, own_session: bool) -> tuple[list[int], str]:
    """What the probe prints, and its session's autogroup as it left it: "/autogroup-N nice K",
    or nothing for a process still in the root group (a tree no setsid ever split from init)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "JOBS_NICENESS": jobs_niceness}
    probe = body + "; print(repr(open('/proc/self/autogroup').read()))"
    out = subprocess.run([sys.executable, "-c", PROBE.format(body=probe)], cwd=BASE, env=env, check=True,
                         capture_output=True, text=True, timeout=120, start_new_session=own_session)
    *printed, group = out.stdout.splitlines()
    return [int(x) for x in " ".join(printed).split()], ast.literal_eval(group)


def test_a_jobs_process_leading_its_own_session_lowers_the_session_too():
    """Under autogroup each session shares the CPU as one: the niceness must be the group's
    (a new session's group starts at 0)."""
    require(AUTOGROUP.exists(), "this kernel has no autogroup (CONFIG_SCHED_AUTOGROUP)")
    own, group = autogroup_after("print(lower_priority())", "7", own_session=True)
    assert own == [max(start(), 7)]
    assert group.split()[-1] == str(max(start(), 7))


def test_a_session_shared_with_its_parent_is_left_alone():
    """Whether this session has a group of its own or is still in the root one (then the file
    reads empty, as under a runner started straight from init), the probe leaves it as it was."""
    require(AUTOGROUP.exists(), "this kernel has no autogroup (CONFIG_SCHED_AUTOGROUP)")
    before = AUTOGROUP.read_text()
    own, group = autogroup_after("print(lower_priority())", "7", own_session=False)
    assert own == [max(start(), 7)]
    assert group == before == AUTOGROUP.read_text()


def test_the_watch_is_started_at_its_niceness_through_the_priority_wrapper():
    """`python -m storefront.priority WATCH_NICENESS command` (scripts/start.sh watch): the
    command runs at the setting's niceness, and, leading its session, so does its autogroup."""
    require(AUTOGROUP.exists(), "this kernel has no autogroup (CONFIG_SCHED_AUTOGROUP)")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "storefront.test_settings", "WATCH_NICENESS": "6"}
    probe = "import os; print(os.getpriority(os.PRIO_PROCESS, 0)); print(open('/proc/self/autogroup').read())"
    out = subprocess.run([sys.executable, "-m", "storefront.priority", "WATCH_NICENESS", sys.executable, "-c", probe],
                         cwd=BASE, env=env, check=True, capture_output=True, text=True, timeout=120,
                         start_new_session=True).stdout.split("\n")
    assert int(out[0]) == max(start(), 6)
    assert out[1].split()[-1] == str(max(start(), 6))
