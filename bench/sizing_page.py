"""Benchmark: the calculator page's htmx response and /api/v1/estimate, in process.

Run: ``.venv/bin/python bench/sizing_page.py [N | --smoke]`` (``--smoke``: 5 requests each — CI). Builds the demo catalog in a throw-away
SQLite database (temporary VAR_DIR), then times full Django requests through the test
client (middleware, URL routing, the two catalog queries, engine, template/JSON). Prints
median/p99 ms per request and the ratio to a trivial view measured in the same run.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["VAR_DIR"] = tempfile.mkdtemp(prefix="sizing-bench-")
os.environ.pop("DATABASE_URL", None)
os.environ.pop("REDIS_URL", None)
os.environ["DJANGO_SETTINGS_MODULE"] = "storefront.test_settings"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import include, path  # noqa: E402


def baseline(request):
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [path("bench/baseline", baseline), path("", include("storefront.urls"))]

CONFIG = json.dumps({
    "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
    "num_attention_heads": 40, "vocab_size": 32000, "max_position_embeddings": 4096,
})
PAGE_QUERY = "/size/?model=llama-2-13b&method=lora&tokens=20000000&epochs=3&vendor=any"
CASES = {
    "baseline (trivial view)": lambda c: c.get("/bench/baseline"),
    "calculator htmx": lambda c: c.get(PAGE_QUERY, HTTP_HX_REQUEST="true"),
    "calculator full page": lambda c: c.get(PAGE_QUERY),
    "API GET estimate": lambda c: c.get(
        "/api/v1/estimate?model=qwen2.5-32b&method=lora&tokens=20000000&epochs=3"),
    "API POST config.json": lambda c: c.post(
        "/api/v1/estimate?method=qlora", data=CONFIG, content_type="application/json"),
}


def _time(fn, client, n: int) -> tuple[float, float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        response = fn(client)
        out.append((time.perf_counter_ns() - t0) / 1e6)
        assert response.status_code == 200, response.status_code
    out.sort()
    return statistics.median(out), out[int(0.99 * (len(out) - 1))]


def main(n: int = 300) -> None:
    setup_test_environment()
    call_command("migrate", verbosity=0)
    from inventory.demo import load_demo_catalog

    load_demo_catalog()
    client = Client()
    # One address makes every request: the benchmark measures the views, not the API's rate limit.
    with override_settings(ROOT_URLCONF=__name__, API_REQUESTS_PER_IP_PER_MINUTE=10**9):
        for fn in CASES.values():  # warm up templates, URL resolver, connections
            _time(fn, client, 5)
        results = {name: _time(fn, client, n) for name, fn in CASES.items()}
    base = results["baseline (trivial view)"][0]
    print(f"{n} requests each, in-process Django test client, SQLite demo catalog")
    for name, (med, p99) in results.items():
        print(f"{name:26s} median {med:7.2f} ms  p99 {p99:7.2f} ms  ratio {med / base:6.1f}×")


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "300"
    main(5 if arg == "--smoke" else int(arg))
