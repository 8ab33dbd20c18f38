"""Benchmark: the calculator's htmx fragment and GET /api/v1/estimate on *varied* inputs,
in process: every request is a new (model, method, seq, batch, vendor) the
render memo has never seen, so the cold path is what is measured.

Run: ``.venv/bin/python bench/calculator_varied.py [N] [--profile] [--sample] [--smoke]``. Builds the
demo catalog in a throw-away SQLite database, then renders N random inputs through the
Django test client and prints the CPU time (``time.process_time``: a loaded machine's
wall clock is noisy) per request, median and p99, next to a trivial view's, the three
taking turns request by request.
``--profile`` prints the cProfile top 30 of the fragment's renders. ``--sample`` samples the
fragment's requests on CPU time (SIGPROF, no tracing: cProfile's cost per call inflates the
parts made of many small calls) and prints the share of each part of the answer, the rest
being the middleware and the test client, which the trivial view pays too.
"""

from __future__ import annotations

import signal
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


#: (file, function) of each part ``--sample`` reports, with its label; a part's share holds its callees
SAMPLED_PARTS = [
    (("inventory/pagecache.py", "wrapper"), "page cache, view and everything in them"),
    (("sizing/views.py", "_fragment"), "  sizing the answer and writing it (the view's own work)"),
    (("sizing/results.py", "run"), "    the engine"),
    (("sizing/recommend.py", "recommend"), "      the recommendation"),
    (("sizing/alternatives.py", "one_change_alternatives"), "      the one-change plans"),
    (("sizing/fragment.py", "results_bytes"), "    the markup"),
    (("sizing/fragment.py", "_bar"), "      the memory bar (both drawings)"),
]


def _sampled(call, n: int) -> tuple[dict, int]:
    """(samples per part of ``SAMPLED_PARTS``, all samples) of ``n`` calls, the stack read at
    every tick of the process's CPU time (the kernel's tick: a few ms, so thousands of calls)."""
    wanted = {key for key, _ in SAMPLED_PARTS}
    counts = dict.fromkeys(wanted, 0)
    total = 0

    def tick(_signum, frame) -> None:
        nonlocal total
        total += 1
        seen = set()
        while frame is not None:
            code = frame.f_code
            key = ("/".join(code.co_filename.rsplit("/", 2)[-2:]), code.co_name)
            if key in wanted and key not in seen:
                seen.add(key)
                counts[key] += 1
            frame = frame.f_back

    previous = signal.signal(signal.SIGPROF, tick)
    signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
    try:
        for i in range(n):
            call(i)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, previous)
    return counts, total


def main(n: int, profile: bool, sample: bool = False) -> None:
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
    queries = varied_queries(4 * n)
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
        if sample:
            counts, total = _sampled(lambda i: client.get("/size/?" + queries[3 * n + i], HTTP_HX_REQUEST="true"), n)
            print(f"calculator htmx (varied), {n} requests sampled on CPU time, {total} samples:")
            for key, label in SAMPLED_PARTS:
                print(f"  {label:58s} {100 * counts[key] / max(total, 1):5.1f} %")
        results = _cpu(cases, n)
    base = results["baseline (trivial view)"][0]
    print(f"{n} distinct random inputs each, in-process Django test client, SQLite demo catalog, CPU time")
    for name, (med, p99) in results.items():
        print(f"{name:27s} median {med:7.2f} ms  p99 {p99:7.2f} ms  ratio {med / base:6.1f}×")


if __name__ == "__main__":
    args = sys.argv[1:]
    count = 5 if "--smoke" in args else int(next((a for a in args if a.isdigit()), "200"))
    main(count, "--profile" in args, "--sample" in args)
