"""Benchmark: the calculator's htmx fragment and GET /api/v1/estimate on *varied* inputs,
in process: every request is a new (model, method, seq, batch, vendor) the
render memo has never seen, so the cold path is what is measured.

Run: ``.venv/bin/python bench/calculator_varied.py [N] [--profile] [--smoke]``. Builds the
demo catalog in a throw-away SQLite database, then renders N random inputs through the
Django test client and prints the CPU time (``time.process_time``: a loaded machine's
wall clock is noisy) per request, median and p99, next to a trivial view's, the three
taking turns request by request.
``--profile`` prints the cProfile top 30 of the fragment's renders.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# bench/sizing_page.py's set-up: a throw-away SQLite database, Django, the trivial view's URLconf
import sizing_page  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import _TestState, setup_test_environment  # noqa: E402
from varied_inputs import BATCHES, SEQS, varied_queries  # noqa: E402,F401 - calculator_compare reads them here


def _cpu(cases: dict, n: int) -> dict[str, tuple[float, float]]:
    """(median, p99) CPU ms per case. The cases take turns request by request, so a change of
    load on a shared machine (other jobs, frequency) moves every case alike and the ratios
    stay comparable."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(n):
        for name, fn in cases.items():
            t0 = time.process_time_ns()
            response = fn(i)
            times[name].append((time.process_time_ns() - t0) / 1e6)
            assert response.status_code in (200, 400), response.status_code
    out = {}
    for name, series in times.items():
        series.sort()
        out[name] = (statistics.median(series), series[int(0.99 * (len(series) - 1))])
    return out


def main(n: int, profile: bool) -> None:
    setup_test_environment()
    # Measure the templates as production renders them (not the test runner's signal-sending
    # wrapper), and the catalog as a steady shop serves it (no stock change during the run).
    from django.template import Template

    Template._render = _TestState.saved_data.template_render
    import inventory.selectors

    inventory.selectors.GENERATION_LOCAL_SECONDS = 3600.0
    call_command("migrate", verbosity=0)
    from inventory.demo import load_demo_catalog

    load_demo_catalog()
    client = Client()
    queries = varied_queries(3 * n)
    cases = {
        "baseline (trivial view)": lambda i: client.get("/bench/baseline"),
        "calculator htmx (varied)": lambda i: client.get("/size/?" + queries[i], HTTP_HX_REQUEST="true"),
        "API GET estimate (varied)": lambda i: client.get("/api/v1/estimate?" + queries[n + i]),
    }
    with override_settings(ROOT_URLCONF=sizing_page.__name__, CATALOG_CACHE_SECONDS=600,
                           API_REQUESTS_PER_IP_PER_MINUTE=10**9):  # one address: measure the views
        client.get("/size/?" + queries[-1], HTTP_HX_REQUEST="true")  # templates, URL resolver
        client.get("/api/v1/estimate?" + queries[-2])
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile(time.process_time)
            prof.enable()
            for i in range(n):
                client.get("/size/?" + queries[2 * n + i], HTTP_HX_REQUEST="true")
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        results = _cpu(cases, n)
    base = results["baseline (trivial view)"][0]
    print(f"{n} distinct random inputs each, in-process Django test client, SQLite demo catalog, CPU time")
    for name, (med, p99) in results.items():
        print(f"{name:27s} median {med:7.2f} ms  p99 {p99:7.2f} ms  ratio {med / base:6.1f}×")


if __name__ == "__main__":
    args = sys.argv[1:]
    count = 5 if "--smoke" in args else int(next((a for a in args if a.isdigit()), "200"))
    main(count, "--profile" in args)
