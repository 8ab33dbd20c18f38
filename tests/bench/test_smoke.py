"""Every script in bench/ runs at its smallest size: a schema or API change that
breaks a benchmark fails CI like any other test. Each runs as a subprocess exactly as the
docs/performance.md commands run it, and must exit 0 and print its figure lines; no
timing is asserted (the figures on a shared CI machine mean nothing). The PostgreSQL ones
run in CI's PostgreSQL pass, each in a throwaway database of its own on that server.

bench/faults.py restarts PostgreSQL and stops Redis, so it runs without DATABASE_URL and
REDIS_URL, on the private cluster and Redis server it starts itself (initdb, redis-server):
the shared ones every other test uses are never touched. bench/fleet.py runs on servers of
its own too, configured as production's. Like every tests/bench test it is
`infra`, so CI runs it once, in the PostgreSQL pass."""
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HAS_REDIS
from tests.deploy.helpers import BENCH_REDIS_DATABASE, own_redis_url
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
    "calculator_varied": ("calculator_varied.py", ["--smoke", "--sample"], False,
                          [rf"{name}\s+median\s+{NUMBER} ms\s+p99\s+{NUMBER} ms\s+ratio\s+{NUMBER}×"
                           for name in ("calculator htmx \\(varied\\)", "API GET estimate \\(varied\\)")]
                          + [r"calculator htmx \(varied\), 5 requests sampled on CPU time, \d+ samples:",
                             rf"the one-change plans\s+{NUMBER} %"]),
    "calculator_instructions": ("calculator_instructions.py", ["frag", "2"], False,
                                [r"frag: 2 requests instrumented \(divide valgrind's Collected by 2\)"]),
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
    # Its own PostgreSQL (autovacuum on) and Redis (append-only), as docker-compose.yml runs them.
    "fleet": ("fleet.py", ["--smoke"], False,
              [r"services: PostgreSQL \d+\.\d+ \(autovacuum on, .*\), Redis [\d.]+ \(appendonly yes\)",
               rf"timeline \(\d+ slices of 5 s\) median: \d+ sent, p99 {NUMBER} ms, .*cores: web {NUMBER}",
               rf"fleet: 20 nodes at 2 s poll: {NUMBER} req/s, p99 desired {NUMBER} ms, p99 report {NUMBER} ms",
               r"dropped bench_fleet_\d+", r"the bench's PostgreSQL and Redis stopped and removed"]),
    # The whole store at once (web, watch, the jobs process, nodes and customers), on servers
    # of its own like fleet's; errors fail it, timings never do.
    "store": ("store.py", ["--smoke"], False,
              [r"20 nodes only waiting \(a watch each held\): storefront RSS web .* MiB per 1,000 nodes",
               rf"\| POST /agent/v1/report/watch \(past its wait\) \| \d+ \| {NUMBER} \| 0 \| {NUMBER}",
               *(rf"\| {label} \| \d+ \| {NUMBER} \| 0 \| {NUMBER}" for label in (
                   "catalog, filtered", "calculator \\(htmx, varied\\)", "lease page \\(session\\)",
                   "GET /api/v1/leases \\(token\\)", "home page")),
               rf"lifecycle: the burst's pass {NUMBER} s, \d+ transitions for 40 due leases",
               r"payment watcher: [1-9]\d* passes over 200 mempool transactions",
               rf"CPU by process kind over the counted window .*web {NUMBER}, watch {NUMBER}, jobs {NUMBER}",
               rf"store: 20 nodes at 2 s poll \+ 4 customer req/s: worst p99 {NUMBER} ms .*, errors 0, .*: held",
               r"dropped bench_store_\d+", r"the bench's PostgreSQL and Redis stopped and removed"]),
    # The nodes' watch on the ASGI process (scripts/start.sh watch), on the shared servers.
    "watch": ("watch.py", ["--smoke", "--use-system-services"], True,
              # a growth in memory: at 50 nodes the collector can make it negative
              [rf"50 watches held: RSS {NUMBER} MiB, -?{NUMBER} MiB per 1,000 waiting nodes .*; CPU while they wait "
               rf"{NUMBER} % of a core",
               rf"one change for all 50 nodes: every node answered; p50 {NUMBER} ms",
               rf"watch: 50 nodes: -?{NUMBER} MiB/1000 nodes, idle CPU {NUMBER} %, {NUMBER} ms CPU per watch, "
               rf"single change p99 {NUMBER} ms"]),
    "fleet_report_cpu": ("fleet_report_cpu.py", ["--smoke"], True,
                         [rf"report cpu: steady {NUMBER} ms, flush {NUMBER} ms, gpus {NUMBER} ms, bare {NUMBER} ms",
                          rf"held report kept: {NUMBER} tracked objects each"]),
    "load": ("load.py", ["--smoke", "--rounds", "2"], True,
             [rf"\| {label} \| `[^`]+` \| {NUMBER} \| {NUMBER} \| {NUMBER}[^|]* \| 0 \| 0 \| {NUMBER}"
              for label in ("bare Django view", "home page", "catalog, filtered", "calculator \\(htmx\\)",
                            "sizing tables", "GET /api/v1/estimate",
                            "calculator \\(htmx\\) \\(varied\\)", "GET /api/v1/estimate \\(varied\\)")] + [r"dropped bench_load_\d+"]),
    # Needs the PostgreSQL and Redis binaries, not the shared servers: runs with neither URL.
    "faults": ("faults.py", ["pg", "redis", "--smoke"], False,
               [r"private PostgreSQL \d+ on 127\.0\.0\.1:\d+ and Redis on 127\.0\.0\.1:\d+",
                rf"pg_ctl restart -m fast took {NUMBER} s \(t = {NUMBER} → {NUMBER} s of {NUMBER} s of load\)",
                r"during the restart: \d+ requests, statuses \{",
                rf"every endpoint answering 200 again {NUMBER} s after the restart returned",
                rf"503s: \d+; p50/max latency during the restart: {NUMBER} / {NUMBER} ms",
                rf"Redis down from t = {NUMBER} to {NUMBER} s",
                r"pages while Redis was down: \d+ requests, statuses \{200: \d+\}",
                rf"page latency before: p50 {NUMBER} ms; while down: p50 {NUMBER} ms, max {NUMBER} ms",
                r"beat log: \d+ ticks sent, \d+ error lines",
                r"dropped bench_faults_\d+", r"all expectations met",
                r"private PostgreSQL and Redis stopped and removed"]),
}


def require_private_servers() -> None:
    """bench/faults.py initdb-s a cluster (Debian keeps initdb off PATH, under
    /usr/lib/postgresql/<ver>/bin) and starts a redis-server; as root it runs PostgreSQL as
    the postgres user through runuser."""
    initdb = glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb")
    require(bool(initdb), "initdb is not installed (apt-get install postgresql)")
    require_tool("redis-server", "apt-get install redis-server")
    if os.geteuid() == 0:
        require_tool("runuser", "util-linux")


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
    if case in ("faults", "fleet", "store"):
        require_private_servers()
    if case == "fleet":
        require_tool("wrk", "scripts/install-test-tools.sh installs it")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    out = run_bench(script, args, env)
    missing = [line for line in lines if not re.search(line, out)]
    assert not missing, f"{script} did not print {missing}:\n{out[-3000:]}"


@pytest.mark.postgres
@pytest.mark.xdist_group("bench")
@pytest.mark.parametrize("case", [name for name, case in CASES.items() if case[2]])
def test_bench_runs_on_postgres(case):
    script, args, _pg, lines = CASES[case]
    if case == "load":
        require_tool("wrk", "scripts/install-test-tools.sh installs it")
    if case in ("load", "fleet_report_cpu", "watch"):
        require(HAS_REDIS, f"bench/{case}.py serves with the Redis cache: set REDIS_URL")
    env = dict(os.environ)
    if HAS_REDIS:    # its nodes are numbered as the suite's are: their versions on a database of its own
        env["REDIS_URL"] = own_redis_url(BENCH_REDIS_DATABASE)
    out = run_bench(script, args, env)
    missing = [line for line in lines if not re.search(line, out)]
    assert not missing, f"{script} did not print {missing}:\n{out[-3000:]}"
