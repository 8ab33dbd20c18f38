"""Every script in bench/ runs at its smallest size (issue 35): a schema or API change that
breaks a benchmark fails CI like any other test. Each runs as a subprocess exactly as the
README/BENCHMARKS.md commands run it, and must exit 0 and print its figure lines; no
timing is asserted (the figures on a shared CI machine mean nothing). The PostgreSQL ones
run in CI's PostgreSQL pass, each in a throwaway database of its own on that server."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HAS_REDIS
from tests.tools import require, require_tool

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
NUMBER = r"[\d,.]+"

# script, arguments, needs PostgreSQL, the figure lines it must print
CASES = {
    "sizing": ("sizing.py", ["--smoke"], False,
               [rf"estimate\+recommend over \d+ offers: median {NUMBER} µs, p99 {NUMBER} µs per call",
                rf"baseline \(sort prices\): median {NUMBER} µs; ratio {NUMBER}×"]),
    "sizing_page": ("sizing_page.py", ["--smoke"], False,
                    [rf"{name}\s+median\s+{NUMBER} ms\s+p99\s+{NUMBER} ms\s+ratio\s+{NUMBER}×"
                     for name in ("baseline \\(trivial view\\)", "calculator htmx", "calculator full page",
                                  "API GET estimate", "API POST config.json")]),
    "calculator_varied": ("calculator_varied.py", ["--smoke"], False,
                          [rf"{name}\s+median\s+{NUMBER} ms\s+p99\s+{NUMBER} ms\s+ratio\s+{NUMBER}×"
                           for name in ("calculator htmx \\(varied\\)", "API GET estimate \\(varied\\)")]),
    "payments_block": ("payments.py", ["--txs", "200", "--watched", "200", "--paid", "20", "--repeat", "2"], False,
                       [rf"watcher pass \(match \+ 20 payments \+ cursor\): {NUMBER} ms",
                        rf"ratio watcher/baseline: {NUMBER}x"]),
    "payments_mempool": ("payments.py", ["--mempool", "500", "--watched", "200", "--paid", "20"], False,
                         [rf"first pass \(fetch \+ match all, \d+ batches\): {NUMBER} s",
                          rf"steady pass \(1% of the pool new\): {NUMBER} ms"]),
    "lifecycle": ("lifecycle.py", ["--smoke"], True,
                  [rf"one pass, nothing due: median {NUMBER} ms, fastest {NUMBER} ms of 2",
                   r"EXPLAIN wipe:",
                   rf"due 40: first pass {NUMBER} s, {NUMBER} ms per due lease .*, {NUMBER} queries per due "
                   r"lease, finished in one pass",
                   r"dropped bench_lifecycle_\d+"]),
    "fleet": ("fleet.py", ["--smoke"], True,
              [rf"fleet: 20 nodes at 2 s poll: {NUMBER} req/s, p99 desired {NUMBER} ms, p99 report {NUMBER} ms",
               r"dropped bench_fleet_\d+"]),
    "load": ("load.py", ["--smoke"], True,
             [rf"\| {label} \| `[^`]+` \| {NUMBER} \| {NUMBER} \| {NUMBER}[^|]* \| 0 \| 0 \| {NUMBER}"
              for label in ("bare Django view", "home page", "catalog, filtered", "calculator \\(htmx\\)",
                            "sizing tables", "GET /api/v1/estimate",
                            "calculator \\(htmx\\) \\(varied\\)", "GET /api/v1/estimate \\(varied\\)")] + [r"dropped bench_load_\d+"]),
}


def run_bench(script: str, args: list[str], env: dict) -> str:
    result = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.xdist_group("bench")
@pytest.mark.parametrize("case", [name for name, case in CASES.items() if not case[2]])
def test_bench_runs_anywhere(case):
    script, args, _pg, lines = CASES[case]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    out = run_bench(script, args, env)
    missing = [line for line in lines if not re.search(line, out)]
    assert not missing, f"{script} did not print {missing}:\n{out[-3000:]}"


@pytest.mark.postgres
@pytest.mark.xdist_group("bench")
@pytest.mark.parametrize("case", [name for name, case in CASES.items() if case[2]])
def test_bench_runs_on_postgres(case):
    script, args, _pg, lines = CASES[case]
    if case in ("load", "fleet"):
        require_tool("wrk", "scripts/install-test-tools.sh installs it")
        require(HAS_REDIS, f"bench/{case}.py serves with the Redis cache: set REDIS_URL")
    out = run_bench(script, args, dict(os.environ))
    missing = [line for line in lines if not re.search(line, out)]
    assert not missing, f"{script} did not print {missing}:\n{out[-3000:]}"
