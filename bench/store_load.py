"""bench/store.py's load generator: the whole fleet and the customers at once, one asyncio
process over bench/rawhttp.py's keep-alive pools.

Each node runs as the agent does (nodeagent/PROTOCOL.md): a round every `poll` seconds at its
own offset, its signed report sent as the report that waits (POST /agent/v1/report/watch on
the ASGI process, held until the next round is due): answered with the desired state (or
`null` while its ETag holds), at once when it moved, then reported again. With
`reports_wait=False` (bench/store.py --report-then-watch), as agents before it: the report to
the web process, and between rounds a held GET /agent/v1/desired/watch; an answer `changed`
starts a round at once (the GET of the desired state) and the next periodic round one
interval later. A node is late when a round starts more than one interval after it was due.

The customers are open-loop: requests leave at the stated rate whatever the answers do, and
each latency counts from the moment its request was due to leave, so a slow server (or a
generator short of connections) shows in the figures instead of slowing the offered load.

Before the counted run every node holds a watch and nothing else happens: the storefront's
RSS against its own with none held, and its CPU while they only wait."""
import asyncio
import base64
import json
import random
import time
from urllib.parse import urlencode

from fleet_load import FULL_GPU_REPORT_EVERY, _pool
from fleet_nodes import report_body
from rawhttp import HttpError, request_bytes
from watch import cpu_seconds, rss_mib

RAMP_PER_SECOND = 1000      # held watches sent per second (bench/watch.py's)
WATCH_GRACE = 30.0          # a held watch's answer may come this late before it is an error


class Figures:
    """Latencies (ms) and errors per endpoint, counted inside the window only."""

    def __init__(self):
        self.lat: dict[str, list[float]] = {}
        self.errors: dict[str, dict[str, int]] = {}
        self.sent_at: list[float] = []          # perf_counter() at which each counted request was due
        self.sent_ms: list[float] = []

    def add(self, endpoint: str, ms: float, due_at: float, error: str | None = None) -> None:
        self.lat.setdefault(endpoint, []).append(ms)
        self.errors.setdefault(endpoint, {})
        if error is not None:
            self.errors[endpoint][error] = self.errors[endpoint].get(error, 0) + 1
        self.sent_at.append(due_at)
        self.sent_ms.append(ms)


def customer_requests(customers: list[dict], seed: int = 5) -> list[tuple[str, str, bytes]]:
    """The customers' mix as (endpoint, weight share, prepared request): the catalog filtered
    several ways, the calculator's htmx fragment on varied inputs, a lease page with a login
    session, GET /api/v1/leases with a token, and the home page."""
    from varied_inputs import varied_queries

    rng, out = random.Random(seed), []
    for vendor, vram in (("nvidia", 40), ("nvidia", 80), ("amd", 0), ("", 24), ("", 0)):
        query = urlencode({k: v for k, v in (("vendor", vendor), ("min_vram", vram)) if v})
        out.append(("catalog, filtered", request_bytes("GET", f"/gpus/?{query}", {})))
    for query in varied_queries(400, seed=rng.randrange(10**6)):
        out.append(("calculator (htmx, varied)", request_bytes("GET", f"/size/?{query}", {"HX-Request": "true"})))
    for c in customers:
        out.append(("lease page (session)", request_bytes("GET", f"/leases/{c['lease']}/", {"Cookie": c["cookie"]})))
        out.append(("GET /api/v1/leases (token)", request_bytes(
            "GET", "/api/v1/leases", {"Authorization": f"Bearer {c['token']}"})))
    out.append(("home page", request_bytes("GET", "/", {})))
    return out


MIX = {"catalog, filtered": 0.25, "calculator (htmx, varied)": 0.25, "lease page (session)": 0.2,
       "GET /api/v1/leases (token)": 0.15, "home page": 0.15}


async def run(*, web: str, watch: str, fleet: list[dict], customers: list[dict], poll: float, settle: float,
              duration: float, idle: float, rate: float, connections: int, customer_connections: int,
              watch_pid: int, web_pid: int, on_schedule, on_counted, reports_wait: bool = True) -> dict:
    """Every node's first watch (its version, untimed), the wait-only phase, then `settle`
    seconds of everything untimed and `duration` seconds counted. `on_schedule(first_rounds,
    counted_from, end)` (epoch seconds) is called once they are known (the jobs process);
    `on_counted()` at the counted window's start (the timeline's sampler) returns its stop."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    n = len(fleet)
    web_pool = _pool(web, connections, timeout=30)
    customer_pool = _pool(web, customer_connections, timeout=30)
    watch_pool = _pool(watch, n + 16, timeout=max(60.0, poll + idle + n / RAMP_PER_SECOND) + WATCH_GRACE)
    keys = [Ed25519PrivateKey.from_private_bytes(node["key"]) for node in fleet]
    figures, state = Figures(), {"late": 0, "rounds": 0, "watches": 0, "changed": 0}
    late_nodes: set[int] = set()
    stopped_at = [0.0] * n          # the round each node was due to start next when it stopped

    def watch_request(node: dict, wait: float) -> bytes:
        return request_bytes("GET", f"/agent/v1/desired/watch?{urlencode({'version': node.get('version', ''), 'wait': f'{wait:.3f}'})}",
                             {"Authorization": f"Node {node['credential']}"})

    # 1. each node's version, untimed (the first watch answers at once: bench/watch.py's first)
    async def first_watch(node: dict):
        for attempt in range(3):
            try:
                status, _, body = await web_pool_for_first.request(watch_request(node, 0))
                if status == 200:
                    node["version"] = json.loads(body)["version"]
                    return
            except HttpError:
                pass
            await asyncio.sleep(1 + attempt)
        raise SystemExit(f"node {node['node']}: no version from the watch")

    web_pool_for_first = _pool(watch, min(200, n), timeout=60)
    try:
        await asyncio.gather(*(first_watch(node) for node in fleet if "version" not in node))
    finally:
        web_pool_for_first.close()
    await asyncio.sleep(1)
    rss_before = {"web": rss_mib(web_pid), "watch": rss_mib(watch_pid)}

    ramp = n / RAMP_PER_SECOND
    start = time.monotonic()
    # Until the first rounds nodes only wait: the server takes the ramp's watches (given as long
    # again), then `idle` seconds are measured.
    quiet_from = start + 2 * ramp + 2
    main_at = quiet_from + idle
    timed_from, deadline = main_at + settle, main_at + settle + duration
    idle_window: dict = {}
    to_epoch = time.time() - time.monotonic()
    on_schedule(main_at + to_epoch, timed_from + to_epoch, deadline + to_epoch)

    def counted(t: float) -> bool:
        return timed_from <= t < deadline

    async def round_trip(node: dict, k: int, due: float, wait: float | None = None,
                         endpoint: str = "POST /agent/v1/report (round)") -> bool:
        """The node's periodic round: its signed report, answered with the desired state; with
        `wait`, the report that waits (held on the ASGI process until a change or `wait` s).
        Returns whether the answer brought a new document."""
        node["seq"] += 1
        node["egress"] = node.get("egress", 10**6) + random.randint(10**6, 10**8)
        data = report_body(node, node["seq"], node.get("ops", {}), node["egress"], desired_etag=node.get("etag", ""),
                           with_gpus=(node["seq"] + node["gpu_phase"]) % FULL_GPU_REPORT_EVERY == 0)
        path = "/agent/v1/report" if wait is None else \
            f"/agent/v1/report/watch?{urlencode({'version': node.get('version', ''), 'wait': f'{wait:.3f}'})}"
        raw = request_bytes("POST", path, {
            "Authorization": f"Node {node['credential']}", "Content-Type": "application/json",
            "X-Node-Signature": base64.b64encode(keys[k].sign(data)).decode()}, data)
        t, error, new_document = time.perf_counter(), None, False
        try:
            status, headers, body = await (web_pool if wait is None else watch_pool).request(raw)
            if status != 200:
                error = str(status)
            else:
                answer = json.loads(body)
                if isinstance(answer.get("desired"), dict):
                    node["ops"] = {i["lease_id"]: i["op_id"] for i in answer["desired"]["instances"]}
                    node["etag"] = answer["desired_etag"]
                    new_document = True
                node["version"] = headers.get("x-desired-version") or node.get("version", "")
        except HttpError as exc:
            error = str(exc).split(":")[0]
        took = (time.perf_counter() - t) * 1000
        if wait is not None and not new_document:      # held: how long after its wait it came
            endpoint, took = "POST /agent/v1/report/watch (past its wait)", max(0.0, took - wait * 1000)
        if counted(due):
            figures.add(endpoint, took, t, error)
        return new_document

    async def changed_round(node: dict):
        """A watch said `changed`: the agent's round at once, a GET of the desired state."""
        t, error = time.perf_counter(), None
        try:
            status, headers, body = await web_pool.request(request_bytes("GET", "/agent/v1/desired", {
                "Authorization": f"Node {node['credential']}", "If-None-Match": node.get("etag", "")}))
            if status == 200:
                document = json.loads(body)
                node["ops"] = {i["lease_id"]: i["op_id"] for i in document["instances"]}
                node["etag"] = headers.get("etag", "")
            elif status != 304:
                error = str(status)
            node["version"] = headers.get("x-desired-version") or node.get("version", "")
        except HttpError as exc:
            error = str(exc).split(":")[0]
        if counted(time.monotonic()):
            figures.add("GET /agent/v1/desired (changed)", (time.perf_counter() - t) * 1000, t, error)

    async def one_node(k: int, node: dict):
        node.setdefault("gpu_phase", random.randrange(FULL_GPU_REPORT_EVERY))
        await asyncio.sleep(k / RAMP_PER_SECOND)
        next_round = main_at + random.uniform(0, poll)
        while True:
            # wait for the next round on the watch (or a change, which starts one at once)
            # Not cut at the window's end: every node's watch expiring at once there is a burst
            # no fleet makes. The last ones are answered after it, uncounted.
            while (left := next_round - time.monotonic()) > 0.02:
                if time.monotonic() >= deadline:
                    stopped_at[k] = next_round
                    return
                t, asked, error = time.perf_counter(), time.monotonic(), None
                try:
                    status, _, body = await watch_pool.request(watch_request(node, left))
                    answer = json.loads(body) if status == 200 else {}
                    if status != 200:
                        error = str(status)
                except HttpError as exc:
                    error, answer = str(exc).split(":")[0], {}
                state["watches"] += counted(asked)
                if answer.get("changed"):
                    node["version"] = answer["version"]
                    state["changed"] += counted(asked)
                    await changed_round(node)
                    next_round = time.monotonic() + poll
                    continue
                # how long after the asked wait the answer came (a held watch's own latency)
                over = (time.perf_counter() - t - left) * 1000
                if counted(asked):
                    figures.add("GET /agent/v1/desired/watch (past its wait)", max(0.0, over), t, error)
                if error is not None:
                    await asyncio.sleep(min(1.0, max(0.0, left)))
            now = time.monotonic()
            if now >= deadline:
                stopped_at[k] = next_round
                return
            if counted(next_round) and now - next_round > poll:
                state["late"] += 1
                late_nodes.add(k)
            state["rounds"] += counted(next_round)
            if not reports_wait:
                await round_trip(node, k, next_round)
                next_round += poll
                continue
            # the agent's report that waits: the rest of the interval, the report's answer held
            next_round += poll
            passes = 0
            while await round_trip(node, k, now, wait=max(0.0, next_round - time.monotonic())) and passes < 2:
                passes += 1            # a new document: converged, reported again (held again)
                state["changed"] += counted(now)
                now = time.monotonic()

    mix = customer_requests(customers)
    by_endpoint: dict[str, list[bytes]] = {}
    for endpoint, raw in mix:
        by_endpoint.setdefault(endpoint, []).append(raw)
    names, weights = list(MIX), [MIX[e] for e in MIX]

    async def one_customer(endpoint: str, raw: bytes, due: float):
        error = None
        try:
            status, _, _ = await customer_pool.request(raw)
            if status != 200:
                error = str(status)
        except HttpError as exc:
            error = str(exc).split(":")[0]
        if counted(due):   # perf_counter and monotonic are one clock on Linux (timeline's slices)
            figures.add(endpoint, (time.monotonic() - due) * 1000, due, error)

    async def customers_at_rate():
        rng, tasks, i = random.Random(11), [], 0
        while (due := main_at + i / rate) < deadline:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            endpoint = rng.choices(names, weights)[0]
            tasks.append(asyncio.create_task(one_customer(endpoint, rng.choice(by_endpoint[endpoint]), due)))
            i += 1
        await asyncio.gather(*tasks)

    lag: list[float] = []

    async def loop_lag():
        """How late the generator's own event loop runs a 50 ms timer (its share of the blame)."""
        while time.monotonic() < deadline:
            t = time.monotonic()
            await asyncio.sleep(0.05)
            if counted(t):
                lag.append((time.monotonic() - t - 0.05) * 1000)

    async def measure_idle():
        await asyncio.sleep(max(0.0, quiet_from - time.monotonic()))
        cpu0, t0 = cpu_seconds(web_pid) + cpu_seconds(watch_pid), time.monotonic()
        await asyncio.sleep(max(0.5, main_at - 0.5 - time.monotonic()))
        idle_window.update(cpu=(cpu_seconds(web_pid) + cpu_seconds(watch_pid) - cpu0) / (time.monotonic() - t0),
                           web=rss_mib(web_pid), watch=rss_mib(watch_pid))
        await asyncio.sleep(max(0.0, timed_from - time.monotonic()))
        stop = on_counted()
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        stop()
        idle_window.update(generator_cpu=time.process_time() - cpu0, elapsed=time.monotonic() - t0)

    try:
        await asyncio.gather(measure_idle(), customers_at_rate(), loop_lag(),
                             *(one_node(k, node) for k, node in enumerate(fleet)))
    finally:
        for pool in (web_pool, customer_pool, watch_pool):
            pool.close()
    # A node still inside an earlier round when the window closed, its next one due more than
    # an interval before the end, was late too (it never got to start that round).
    late_nodes.update(k for k, due in enumerate(stopped_at) if timed_from <= due + poll < deadline)
    return {"figures": figures, **state, "late_nodes": len(late_nodes), "lag": lag, "duration": duration, "elapsed": idle_window["elapsed"],
            "generator_cpu": idle_window["generator_cpu"], "rss_before": rss_before,
            "rss_held": {"web": idle_window["web"], "watch": idle_window["watch"]}, "idle_cpu": idle_window["cpu"],
            "timed_from": timed_from, "rate": rate}
