"""Benchmark: instructions per request of the calculator's cold answers, which a loaded
machine does not move (CPU time on a shared 2-core host varies by a third between runs).

Run under callgrind, instrumenting only the timed requests:

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.%p \\
        .venv/bin/python bench/calculator_instructions.py frag 50

with ``base`` (the trivial view), ``frag`` (the htmx fragment) or ``api`` (GET
/api/v1/estimate); "Collected" in valgrind's summary, divided by N, is the figure. Each
request is a new input (bench/calculator_varied.py's generator), as in that benchmark.
Setting up takes a few minutes under valgrind; run the cases of two trees side by side.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calculator_varied as cv  # noqa: E402 - sets up Django (bench/sizing_page.py)
import sizing_page  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import _TestState, setup_test_environment  # noqa: E402


def _instrument(on: bool) -> None:
    control = shutil.which("callgrind_control")
    if control:  # outside valgrind this finds no process and does nothing
        subprocess.run([control, "-i", "on" if on else "off", str(os.getpid())],  # noqa: S603
                       capture_output=True, check=False)


def main(case: str, n: int) -> None:
    setup_test_environment()
    from django.template import Template

    Template._render = _TestState.saved_data.template_render  # as production renders
    import inventory.selectors

    inventory.selectors.GENERATION_LOCAL_SECONDS = 3600.0
    call_command("migrate", verbosity=0)
    from inventory.demo import load_demo_catalog

    load_demo_catalog()
    client = Client()
    queries = cv.varied_queries(3 * n + 10)
    fn = {"base": lambda i: client.get("/bench/baseline"),
          "frag": lambda i: client.get("/size/?" + queries[i], HTTP_HX_REQUEST="true"),
          "api": lambda i: client.get("/api/v1/estimate?" + queries[n + i])}[case]
    with override_settings(ROOT_URLCONF=sizing_page.__name__, CATALOG_CACHE_SECONDS=600,
                           API_REQUESTS_PER_IP_PER_MINUTE=10**9):
        for i in range(2 * n, 2 * n + 5):  # templates, URL resolver, catalog
            fn(i)
        # a full collection walks every object since start-up (~2 M instructions a request
        # over 50): in a worker it comes once in thousands of requests, in a window of 50
        # it came or not with the hash seed; after this one none is due in the window
        gc.collect()
        _instrument(True)
        for i in range(n):
            fn(i)
        _instrument(False)
    print(f"{case}: {n} requests instrumented (divide valgrind's Collected by {n})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50)
