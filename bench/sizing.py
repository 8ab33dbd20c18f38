"""Benchmark: estimate + recommend per call over the 13-offer default catalog.

Run: ``.venv/bin/python bench/sizing.py`` (``--smoke``: 20 calls, checks it runs — CI). Prints median/p99 µs per call and the ratio to a
trivial baseline function timed in the same run (so machines can be compared).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "sizing")]
# the engine's warnings go through Django's gettext, which needs configured settings
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.test_settings")

import django  # noqa: E402

django.setup()

from conftest import build_catalog  # noqa: E402

from sizing import estimate, parse_request, recommend  # noqa: E402

QUERIES = [
    {"model": "llama-2-7b", "method": "qlora"},
    {"model": "qwen2.5-32b", "method": "lora", "tokens": 20_000_000, "epochs": 3},
    {"model": "llama-2-70b", "method": "full", "vendor": "any"},
    {"params": 13, "method": "full-8bit", "seq": 4096},
]


def _baseline(job, catalog):
    return sorted(c.monthly_cents for c in catalog)[0] + job.seq


def _time(fn, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    out.sort()
    return statistics.median(out), out[int(0.99 * (len(out) - 1))]


def main(n: int = 2000) -> None:
    catalog = build_catalog()
    requests = [parse_request(q) for q in QUERIES]

    def call():
        for r in requests:
            estimate(r.job)
            recommend(r.job, catalog, vendor=r.vendor)

    def base():
        for r in requests:
            _baseline(r.job, catalog)

    call(), base()  # warm up
    med, p99 = _time(call, n)
    bmed, bp99 = _time(base, n)
    k = len(requests)
    print(f"estimate+recommend over {len(catalog)} offers: median {med / k:.1f} µs, "
          f"p99 {p99 / k:.1f} µs per call")
    print(f"baseline (sort prices): median {bmed / k:.2f} µs; ratio {med / bmed:.0f}×")


if __name__ == "__main__":
    main(20 if "--smoke" in sys.argv[1:] else 2000)
