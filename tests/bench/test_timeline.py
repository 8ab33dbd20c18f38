"""bench/timeline.py's report lines, which tests/bench/test_smoke.py and scripts read: the
web server's share is always printed (a smoke run's rounds to 0.00 and vanished, failing CI),
and a median of an even number of slices prints a whole number of requests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from timeline import ROLES, report  # noqa: E402


def _row(start: float, requests: int, p99: float, **cores) -> dict:
    return {"from s": start, "requests": requests, "p50 ms": p99 / 2, "p99 ms": p99, "max ms": p99 * 1.5,
            **{role: cores.get(role, 0.0) for role in (*ROLES, "busy", "iowait")},
            "dirty MB": 0.0, "writeback MB": 0.0}


def test_the_web_share_is_printed_even_when_it_rounds_to_nothing():
    [median, slowest] = report([_row(0, 40, 6.0, other=0.5, busy=0.18)], worst=1)
    assert "median: 40 sent, p99 6 ms, max 9 ms; cores: web 0.00, other 0.50;" in median
    assert "slowest, from 0 s: 40 sent" in slowest and "cores: web 0.00, other 0.50" in slowest


def test_a_median_of_an_even_number_of_slices_prints_whole_requests():
    rows = [_row(0, 3336, 9.0, web=0.5), _row(5, 3337, 11.0, web=0.6)]
    median = report(rows, worst=0)[0]
    assert median.startswith("  timeline (2 slices of 5 s) median: 3336 sent, p99 10 ms")
    assert "cores: web 0.55;" in median
