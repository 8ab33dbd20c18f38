"""fleet/checks.py: the interval a node may be told fits one wait and the staleness rule."""
from datetime import timedelta

import pytest

from fleet.checks import node_pace_fits_the_timers


def ids(errors) -> list[str]:
    return [e.id for e in errors]


def test_the_shipped_timers_pass():
    assert node_pace_fits_the_timers(None) == []


@pytest.mark.parametrize("changed, expected", [
    ({"NODE_POLL_MAX_SECONDS": 10}, ["fleet.E001"]),                               # below the 15 s floor
    ({"NODE_WATCH_MAX_SECONDS": 45}, ["fleet.E002"]),                              # a wait shorter than 60 s
    ({"NODE_REPORT_STALE_AFTER": timedelta(minutes=2)}, ["fleet.E003"]),           # 60 + 2 x 60 s needed
    ({"NODE_SEEN_WRITE_SECONDS": 61}, ["fleet.E003"]),
    ({"NODE_REPORTS_PER_SECOND": 0}, ["fleet.E004"]),
    ({"NODE_POLL_STEP_SECONDS": 0}, ["fleet.E004"]),
])
def test_a_pace_that_does_not_fit_is_an_error(settings, changed, expected):
    for name, value in changed.items():
        setattr(settings, name, value)
    assert ids(node_pace_fits_the_timers(None)) == expected
