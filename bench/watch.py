"""What a node waiting for a change to its desired state costs, and how fast a change reaches it.

The nodes' watch (GET /agent/v1/desired/watch, nodeagent/PROTOCOL.md) is served by the ASGI
process as production starts it (scripts/start.sh watch: granian, one worker). This bench
enrols N nodes straight into a throwaway database (bench/fleet_nodes.py's enrol_fleet: real
credentials, two running leases each), then per size:

1. each node's first watch (the credential looked up once per worker), timed;
2. N watches held at once: the process tree's RSS against its own idle baseline measured
   first in the same run (MiB per 1,000 waiting nodes), and its CPU while they wait (an
   idle wait should cost memory, not CPU);
3. one change for every node (a new fleet epoch): the time from the commit to each node's
   answer, p50/p99/max;
4. changes to single nodes, one at a time, from this process (over Redis pub/sub, as a
   Celery worker's change would): the time to that node's answer, p50/p99, beside the plain
   poll it replaces (a change waits on average half the poll interval, at worst all of it).

    .venv/bin/python bench/watch.py                     # 1,000 and 10,000 waiting nodes
    .venv/bin/python bench/watch.py 2000 --singles 100
    .venv/bin/python bench/watch.py --smoke             # seconds: 50 nodes (tests/bench)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python bench/watch.py 1000 --use-system-services
"""
import argparse
import asyncio
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE), str(BASE / "bench")]

from fleet_nodes import enrol_fleet  # noqa: E402
from load import PY, manage, production_env, wait_http, with_db  # noqa: E402
from private_services import on_services  # noqa: E402
from timeline import percentile  # noqa: E402

POLL_SECONDS = 15          # the plain poll a watch replaces (NODE_POLL_SECONDS' default)
RAMP_PER_SECOND = 1000     # held watches sent per second (10,000 nodes at a 15 s poll: 667/s)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, default=[1000, 10000])
    parser.add_argument("--singles", type=int, default=200, help="changes to single nodes, one at a time")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the held watches are measured idle")
    parser.add_argument("--use-system-services", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="50 nodes, 20 single changes, 2 s idle")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.singles, args.idle = [50], 20, 2.0
    return args


def tree_of(pid: int) -> list[int]:
    """The process and its descendants (granian's workers)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def rss_mib(pid: int) -> float:
    total = 0
    for p in tree_of(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def cpu_seconds(pid: int) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in tree_of(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / ticks


async def settle(pid: int, *, below: float = 0.03, limit: float = 400.0) -> float:
    """Wait until the server has taken every watch sent (a 1 s slice of its CPU under `below`
    of a core), at most `limit` seconds; returns how long that took."""
    started = time.monotonic()
    await asyncio.sleep(1)
    while time.monotonic() - started < limit:
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(1)
        if (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0) < below:
            break
    return time.monotonic() - started


class Watcher:
    """N nodes' watches over one aiohttp session (a connection each while held)."""

    def __init__(self, base: str, fleet: list[dict]):
        self.base, self.fleet = base, fleet
        self.versions: dict[int, str] = {}

    async def one(self, session, k: int, wait: float, after: float = 0.0) -> tuple[bool, float]:
        """Node k's watch, sent `after` seconds from now (a fleet's watches arrive spread
        over its poll interval, not in one burst: 10,000 SYNs at once overflow the listen
        backlog, which no real fleet does)."""
        if after:
            await asyncio.sleep(after)
        node = self.fleet[k]
        params = {"version": self.versions.get(k, ""), "wait": str(wait)}
        async with session.get(f"{self.base}/agent/v1/desired/watch", params=params,
                               headers={"Authorization": f"Node {node['credential']}"}) as response:
            answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {answer}")
        self.versions[k] = answer["version"]
        return answer["changed"], time.monotonic()


async def run_size(base: str, fleet: list[dict], node_pks: list[int], pid: int, args, baseline_rss: float):
    import aiohttp
    from asgiref.sync import sync_to_async

    from fleet.desired_version import ALL, desired_changed

    n = len(fleet)
    watcher = Watcher(base, fleet)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None)     # 10,000 sent at once queue at the server
    # The first watches on a session of their own, closed after: its idle keep-alive
    # connections would otherwise stay open beside the held ones (two sockets per node).
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200), timeout=timeout) as session:
        t, cpu0 = time.perf_counter(), cpu_seconds(pid)
        firsts = await asyncio.gather(*(watcher.one(session, k, 0) for k in range(n)))
        assert all(changed for changed, _ in firsts)
        print(f"  first watch of each node (credential looked up): {n} in {time.perf_counter() - t:.1f} s, "
              f"{(cpu_seconds(pid) - cpu0) / n * 1000:.2f} ms of server CPU each", flush=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.sleep(1)
        before = rss_mib(pid)          # warmed by the first watches, none held

        cpu0, ramp = cpu_seconds(pid), n / RAMP_PER_SECOND
        held = [asyncio.create_task(watcher.one(session, k, 60, k / RAMP_PER_SECOND)) for k in range(n)]
        await asyncio.sleep(ramp)
        settled = await settle(pid)
        steady_ms = (cpu_seconds(pid) - cpu0) / n * 1000
        assert not any(task.done() for task in held), [t.result() for t in held if t.done()][:3]
        print(f"  {n} watches sent over {ramp:.0f} s; the server had taken them {settled:.1f} s later, "
              f"{steady_ms:.2f} ms of CPU each (a node's steady watch: once per poll interval)", flush=True)
        rss, cpu0, t0 = rss_mib(pid), cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(args.idle)
        idle_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        per_thousand = (rss - before) / n * 1000
        print(f"  {n} watches held: RSS {rss:.0f} MiB, {per_thousand:.1f} MiB per 1,000 waiting nodes (over the "
              f"{before:.0f} MiB with none held; idle at start {baseline_rss:.0f} MiB); CPU while they wait "
              f"{idle_cpu * 100:.1f} % of a core", flush=True)

        bumped = time.monotonic()
        await sync_to_async(desired_changed)(ALL)
        answers = await asyncio.gather(*held)
        assert all(changed for changed, _ in answers)
        lat = [(at - bumped) * 1000 for _, at in answers]
        print(f"  one change for all {n} nodes: every node answered; p50 {percentile(lat, 50):.0f} ms, "
              f"p99 {percentile(lat, 99):.0f} ms, max {max(lat):.0f} ms after the commit", flush=True)

        held = {k: asyncio.create_task(watcher.one(session, k, 60, k / RAMP_PER_SECOND)) for k in range(n)}
        await asyncio.sleep(ramp)
        await settle(pid)
        singles = []
        for k in random.Random(7).sample(range(n), min(args.singles, n)):
            bumped = time.monotonic()
            await sync_to_async(desired_changed)([node_pks[k]])
            changed, at = await held.pop(k)
            assert changed
            singles.append((at - bumped) * 1000)
        for task in held.values():
            task.cancel()
        await asyncio.gather(*held.values(), return_exceptions=True)
    p50, p99 = percentile(singles, 50), percentile(singles, 99)
    print(f"  {len(singles)} changes to single nodes while {n} wait: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
          f"(the plain {POLL_SECONDS} s poll: {POLL_SECONDS / 2 * 1000:.0f} ms on average, "
          f"{POLL_SECONDS * 1000} ms at worst; p99 {POLL_SECONDS * 1000 / p99:.0f}x sooner than the worst)")
    print(f"watch: {n} nodes: {per_thousand:.1f} MiB/1000 nodes, idle CPU {idle_cpu * 100:.1f} %, "
          f"{steady_ms:.2f} ms CPU per watch, single change p99 {p99:.1f} ms", flush=True)


def bench(args, url: str, redis_url: str) -> None:
    import psycopg

    name, var_dir = f"bench_watch_{os.getpid()}", tempfile.mkdtemp(prefix="bench-watch-")
    admin_url = with_db(url, "postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    server = log = None
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = production_env(with_db(url, name), redis_url, var_dir, NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE="1000",
                             WATCH_BIND=f"127.0.0.1:{port}",
                             PATH=f"{Path(PY).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        env["HOST_AGENT"] = "fleet.driver.NodeAgentDriver"      # production's driver: real nodes
        manage(env, "migrate", "--noinput")
        manage(env, "load_demo")
        os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
        import django
        django.setup()
        from inventory.models import Node

        log = open(Path(var_dir) / "watch.log", "w")  # noqa: SIM115 - closed below
        server = subprocess.Popen(["bash", "scripts/start.sh", "watch"], cwd=BASE, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/healthz")
        time.sleep(2)
        baseline = rss_mib(server.pid)
        cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
        time.sleep(min(args.idle, 5))
        print(f"watch process (granian ASGI, 1 worker) idle: RSS {baseline:.0f} MiB, CPU "
              f"{(cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0) * 100:.1f} % of a core", flush=True)
        fleet = []
        for size in sorted(args.sizes):
            t = time.perf_counter()
            fleet += enrol_fleet(size - len(fleet), len(fleet))
            pks = dict(Node.objects.filter(name__startswith="bench-").values_list("name", "pk"))
            print(f"== {size} nodes enrolled in {time.perf_counter() - t:.1f} s", flush=True)
            asyncio.run(run_size(base, fleet, [pks[node["node"]] for node in fleet], server.pid, args, baseline))
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(15)
        if log is not None:
            log.close()
        if "DJANGO_SETTINGS_MODULE" in os.environ:
            from django.db import connections
            connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def raise_open_files() -> None:
    """10,000 connections at each end, and the servers started after inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (65536, 65536))
    except (ValueError, OSError):       # not root: as far as the hard limit goes
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    args = parse_args()
    raise_open_files()
    on_services(args.use_system_services, lambda url, redis_url: bench(args, url, redis_url))

if __name__ == "__main__":
    main()
