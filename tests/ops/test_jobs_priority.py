"""The background processes yield the CPU to requests (storefront/celery.py, JOBS_NICENESS):
Celery's worker and beat raise their niceness when they start, once however often asked,
and never lower one they were started with. Each case runs in a process of its own: a
niceness once raised cannot be lowered again without privileges."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
