"""CPU of one node report, steady and flushing, against the bare view.

bench/fleet.py measures a whole fleet over HTTP; this isolates the report's own cost in one
process (Django's test client, production settings, PostgreSQL and Redis), so a change to the
report path can be compared with the bare Django view of the same run:

- steady: an unchanged report (2 instances, egress growing 1 MB a report): nothing written;
- flush: both instances' egress past NODE_EGRESS_FLUSH_BYTES in every report, so every report
  stores both instance reports and meters their egress (one report in ~20 does at the poll rate);
- gpus: a steady report with the node's 8 GPUs, unchanged (the agent sends them at least every
  20th report);
- bare: GET /bench/bare;
- held: the steady report as the report that waits (POST /agent/v1/report/watch) through the
  ASGI application the watch process serves, held 10 ms and answered "nothing new" — 100 at
  once on one event loop, as the process holds them;
- watch: GET /agent/v1/desired/watch likewise, held 10 ms;
- kept: what a held report keeps while it waits, which the cyclic garbage collector walks in
  every full collection of the watch process (with thousands held, each collection pauses the
  event loop for as long): the objects it tracks per held report (a count; the time of one
  collection, with a hundred held, was lost in the noise).

Each figure is the median of 5 rounds of 100 requests, in CPU milliseconds of this process
(PostgreSQL and Redis run elsewhere), with the statements of one request of each kind.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/9 \\
        .venv/bin/python bench/fleet_report_cpu.py [--smoke] [--profile steady|flush|gpus|bare]

--profile KIND then runs 1,000 requests of that kind under cProfile and prints where their
CPU went (the functions by own time, then by cumulative time); BENCH_FLEET_SQL=1 prints the
statements of one request of each kind.
"""
import base64
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE), str(BASE / "bench")]

from fleet_nodes import enrol_fleet, report_body  # noqa: E402
from load import manage, production_env, with_db  # noqa: E402

ROUNDS, PER_ROUND = (3, 10) if "--smoke" in sys.argv else (5, 100)   # --smoke: checks it runs (CI)
PROFILE = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None


def cpu_ms(call, rounds: int = ROUNDS, n: int = PER_ROUND) -> float:
    times = []
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(n):
            call()
        times.append((time.process_time() - t) * 1000 / n)
    return sorted(times)[rounds // 2]


def main() -> None:
    url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not redis_url:
        raise SystemExit("Set DATABASE_URL (a PostgreSQL server) and REDIS_URL")
    import psycopg

    name = f"bench_report_cpu_{os.getpid()}"
    with psycopg.connect(with_db(url, "postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = production_env(with_db(url, name), redis_url, tempfile.mkdtemp(prefix="bench-report-"),
                             NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE="1000000",
                             EGRESS_SLACK_BYTES=str(10**15))   # gigabytes within milliseconds
        env["HOST_AGENT"] = "fleet.driver.NodeAgentDriver"
        manage(env, "migrate", "--noinput")
        manage(env, "load_demo")
        os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
        import django
        django.setup()
        fleet = enrol_fleet(PER_ROUND + 6, 0)
        run(fleet[5], fleet[6:])
    finally:
        from django.db import connections
        connections.close_all()
        with psycopg.connect(with_db(url, "postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(node: dict, held_fleet: list[dict]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    auth = {"HTTP_AUTHORIZATION": f"Node {node['credential']}"}
    client, key = Client(HTTP_HOST="127.0.0.1"), Ed25519PrivateKey.from_private_bytes(node["key"])
    document = client.get("/agent/v1/desired", **auth)
    etag, ops = document["ETag"], {i["lease_id"]: i["op_id"] for i in document.json()["instances"]}
    state = {"seq": 1, "egress": 10**6}

    def report(grow: int, with_gpus: bool = False) -> None:
        state["seq"] += 1
        state["egress"] += grow
        body = report_body(node, state["seq"], ops, state["egress"], desired_etag=etag,
                                       with_gpus=with_gpus or state["seq"] == 2)
        response = client.post("/agent/v1/report", body, content_type="application/json",
                               HTTP_X_NODE_SIGNATURE=base64.b64encode(key.sign(body)).decode(), **auth)
        assert response.status_code == 200, response.content

    def bare() -> None:
        assert client.get("/bench/bare").status_code == 200

    kinds = {"bare": bare, "steady": lambda: report(10**6), "flush": lambda: report(2 * 10**9),
             "gpus": lambda: report(10**6, with_gpus=True)}
    report(10**6)
    figures = asgi_figures(client, held_fleet)
    kept = figures.pop("kept")
    for label, call in kinds.items():
        call()
        with CaptureQueriesContext(connection) as queries:
            call()
        statements = len(queries.captured_queries)
        if os.environ.get("BENCH_FLEET_SQL"):       # the statements of one request of each kind
            print(f"-- {label}:\n" + "\n".join(f"  {q['sql'][:150]}" for q in queries.captured_queries))
        figures[label] = (cpu_ms(call), statements)
    bare_ms = figures["bare"][0]
    for label, (ms, statements) in sorted(figures.items(), key=lambda item: item[0] != "bare"):
        print(f"{label:>6}: {ms:.2f} ms CPU per request ({ms / bare_ms:.1f}x bare), {statements} statements")
    print(f"report cpu: steady {figures['steady'][0]:.2f} ms, flush {figures['flush'][0]:.2f} ms, "
          f"gpus {figures['gpus'][0]:.2f} ms, bare {bare_ms:.2f} ms; held {figures['held'][0]:.2f} ms, "
          f"watch {figures['watch'][0]:.2f} ms")
    print(f"held report kept: {kept[0]:.0f} tracked objects each (this harness's own request and scope included); "
          f"left {kept[1]:.1f} objects of cyclic garbage each, from its arrival to its answer")
    if PROFILE:
        profile(kinds[PROFILE])


def asgi_figures(client, fleet: list[dict]) -> dict:
    """The held report and the watch through storefront.asgi (the watch process's app), one
    per node of `fleet` at once on one event loop, held 10 ms: CPU per request, median of
    ROUNDS."""
    import asyncio
    from urllib.parse import urlencode

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from storefront.asgi import application

    for node in fleet:
        document = client.get("/agent/v1/desired", HTTP_AUTHORIZATION=f"Node {node['credential']}")
        node.update(etag=document["ETag"], version=document["X-Desired-Version"], seq=1, egress=10**6,
                    signer=Ed25519PrivateKey.from_private_bytes(node["key"]),
                    ops={i["lease_id"]: i["op_id"] for i in document.json()["instances"]})

    async def call(path: str, query: str, body: bytes, headers: list) -> int:
        sent, parts = [], [body]

        async def receive():
            return {"type": "http.request", "body": parts.pop() if parts else b"", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST" if body else "GET",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
                 "root_path": "", "headers": [(b"host", b"127.0.0.1"), *headers], "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 8001)}
        await application(scope, receive, send)
        return sent[0]["status"]

    def auth(node: dict) -> tuple[bytes, bytes]:
        return b"authorization", f"Node {node['credential']}".encode()

    def held(node: dict, wait: str = "0.01"):
        node["seq"] += 1
        node["egress"] += 10**6
        body = report_body(node, node["seq"], node["ops"], node["egress"], desired_etag=node["etag"], with_gpus=False)
        signed = [auth(node), (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                  (b"x-node-signature", base64.b64encode(node["signer"].sign(body)).decode().encode())]
        return call("/agent/v1/report/watch", urlencode({"version": node["version"], "wait": wait}), body, signed)

    def watch(node: dict):
        return call("/agent/v1/desired/watch", urlencode({"version": node["version"], "wait": "0.01"}), b"",
                    [auth(node)])

    async def batch(make, n: int) -> list[int]:
        return await asyncio.gather(*(make(node) for node in fleet[:n]))

    loop = asyncio.new_event_loop()
    try:
        figures = {}
        for label, make in (("held", held), ("watch", watch)):
            statuses = loop.run_until_complete(batch(make, 10))
            assert set(statuses) == {200}, statuses
            times = []
            for _ in range(ROUNDS):
                t = time.process_time()
                loop.run_until_complete(batch(make, PER_ROUND))
                times.append((time.process_time() - t) * 1000 / PER_ROUND)
            figures[label] = (sorted(times)[ROUNDS // 2], -1)
        figures["kept"] = loop.run_until_complete(kept_while_held(lambda node: held(node, "30"), fleet[:PER_ROUND]))
        return figures
    finally:
        loop.close()


async def kept_while_held(hold, fleet: list[dict]) -> tuple[float, float]:
    """Per held report of `fleet`: the objects the collector tracks while it waits (counted
    once every report waits), and the cyclic garbage it leaves from its arrival to its answer
    (the objects only the collector frees: counted with automatic collection off meanwhile)."""
    import asyncio
    import gc

    from fleet import desired_watch

    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        waits = [asyncio.ensure_future(hold(node)) for node in fleet]
        deadline = time.monotonic() + 60
        while desired_watch.bell.count() < len(fleet):
            assert time.monotonic() < deadline and not any(w.done() for w in waits), "the reports were not held"
            await asyncio.sleep(0.01)
        garbage = gc.collect()
        objects = len(gc.get_objects()) - before
        desired_watch.bell.ring(desired_watch.EVERY_NODE, ("epoch", "kept"))   # a new epoch: each answers at once
        assert set(await asyncio.gather(*waits)) == {200}
        del waits
        garbage += gc.collect()
    finally:
        gc.enable()
    return objects / len(fleet), garbage / len(fleet)


def profile(call, n: int = 1000) -> None:
    profiler = cProfile.Profile(time.process_time)     # CPU, not waiting on Redis or PostgreSQL
    profiler.runcall(lambda: [call() for _ in range(n)])
    stats = pstats.Stats(profiler).strip_dirs()
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(45)
    if os.environ.get("PROFILE_CALLERS"):
        stats.print_callers(os.environ["PROFILE_CALLERS"])


if __name__ == "__main__":
    main()
