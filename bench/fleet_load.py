"""The fleet bench's load generator (bench/fleet.py): each node's untimed first round, then
the whole fleet polling at its own offset in the interval — the signed report answered with
the desired state, or an older agent's GET — over bench/rawhttp.py's keep-alive pools, one
asyncio process that measures itself: latencies, errors, late polls and the server's counters
over the counted window."""
import asyncio
import base64
import json
import random
import time

from fleet_nodes import TELEMETRY_EVERY, report_body
from rawhttp import HttpError, Pool, request_bytes
from timeline import Sampler, percentile, slices

WARM_REPORTS = 4      # each node's untimed reports before the timed run
FULL_GPU_REPORT_EVERY = 20   # the agent's (nodeagent/agent.py): a report with GPUs at least this often


async def warm(base: str, fleet: list[dict], connections: int) -> None:
    """Each node's first round, untimed: the GET that issues its ops and the first full
    report (GPUs, instances, metering rows), as a fleet that has been running for a while
    did long ago. Leaves each node's ETag and ops in its dict for the timed run."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pool = _pool(base, connections, timeout=120)

    async def first(node: dict):
        auth = {"Authorization": f"Node {node['credential']}"}
        status, headers, body = await pool.request(request_bytes("GET", "/agent/v1/desired", auth))
        if status != 200:
            raise HttpError(f"desired: {status}")
        document = json.loads(body)
        node["etag"] = headers.get("etag", "")
        node["ops"] = {i["lease_id"]: i["op_id"] for i in document["instances"]}
        key = Ed25519PrivateKey.from_private_bytes(node["key"])
        # The first, full report, then steady ones until the storefront holds what a node that
        # has run a while left there (each worker's copy of its credential; an ETag stored by
        # the GET, which could not say which Redis answered, computed again once by a report).
        first_seq = node.get("seq", 0) + 1       # above what per_poll_costs sent for its node
        for seq in range(first_seq, first_seq + WARM_REPORTS):
            data = report_body(node, seq, node["ops"], 10**6, desired_etag=node["etag"], with_gpus=seq == first_seq)
            status, _, body = await pool.request(request_bytes("POST", "/agent/v1/report", {
                **auth, "Content-Type": "application/json",
                "X-Node-Signature": base64.b64encode(key.sign(data)).decode()}, data))
            if status == 200 and isinstance(json.loads(body).get("desired"), dict):
                answer = json.loads(body)
                node["etag"] = answer["desired_etag"]
                node["ops"] = {i["lease_id"]: i["op_id"] for i in answer["desired"]["instances"]}
        node["seq"] = first_seq + WARM_REPORTS - 1

    async def first_retried(node: dict):
        for attempt in range(3):        # a busy server may drop a connection: untimed, so retried
            try:
                return await first(node)
            except HttpError:
                if attempt == 2:
                    raise
                await asyncio.sleep(1 + attempt)

    try:
        await asyncio.gather(*(first_retried(n) for n in fleet if "etag" not in n))
    finally:
        pool.close()


async def drive(bases: list[str], fleet: list[dict], *, poll: float, duration: float, connections: int,
                protocol: str, settle: float, mark, sampler: Sampler, telemetry: bool = False) -> dict:
    """The fleet polls for `settle` seconds untimed, then `duration` seconds counted. The
    settle period runs on the same connections: each web worker meets every node it has
    not served yet (a per-worker credential lookup, paid once per node and worker restart,
    not per poll), so the counted window is the steady state. `mark()` reads the server's
    counters, at the start and at the end of the counted window; `sampler` runs through it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    lat = {"desired": [], "report": []}
    sent_at: list[float] = []                   # perf_counter() at which each counted report was sent
    stats = {"errors": 0, "not_modified": 0, "requests": 0, "answered": 0, "late": 0, "gets": 0, "why": {}}

    def failed(why) -> None:
        stats["errors"] += 1
        stats["why"][why] = stats["why"].get(why, 0) + 1
    from django.conf import settings

    flush_bytes = settings.NODE_EGRESS_FLUSH_BYTES
    keys = [Ed25519PrivateKey.from_private_bytes(n["key"]) for n in fleet]
    timed_from = time.monotonic() + settle
    deadline = timed_from + duration
    pools = [_pool(base, max(1, connections // len(bases)), timeout=30) for base in bases]
    window = {}

    async def one_node(k: int, node: dict):
        auth = {"Authorization": f"Node {node['credential']}"}
        pool = pools[k % len(pools)]            # a node polls one host (its load balancer's choice)
        etag, ops, seq = node.get("etag", ""), node.get("ops", {}), node.get("seq", 0)
        # A fleet that has run a while, not one that started together: each node is at its own
        # point between two egress flushes (by bytes) and between two full GPU reports. Started
        # in step, every node sent its GPUs in the same poll interval (1 in 20) and flushed its
        # egress within a few intervals, a burst the counted window then measured.
        egress = node.get("egress") or 10**6 + random.randrange(flush_bytes)
        gpu_phase = random.randrange(FULL_GPU_REPORT_EVERY)
        telemetry_phase = random.randrange(TELEMETRY_EVERY)   # a fleet's minutes spread over the polls
        next_at = time.monotonic() + random.uniform(0, poll)
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if time.monotonic() >= deadline:
                # The next size's run goes on from here: its fleet holds this one's nodes, whose
                # lower seqs would be refused (409) and whose counters would seem to restart.
                node.update(seq=seq, etag=etag, ops=ops, egress=egress)
                return
            counted = time.monotonic() >= timed_from
            if counted and time.monotonic() - next_at > poll:
                stats["late"] += 1              # the generator (or server) fell a whole poll behind
            next_at += poll
            if protocol == "get" or not etag:   # the agent's first round, or an older agent
                t = time.perf_counter()
                try:
                    status, headers, body = await pool.request(request_bytes(
                        "GET", "/agent/v1/desired", {**auth, **({"If-None-Match": etag} if etag else {})}))
                    if status == 200:
                        ops = {i["lease_id"]: i["op_id"] for i in json.loads(body)["instances"]}
                        etag = headers.get("etag", "")
                    elif status == 304:
                        stats["not_modified"] += counted
                    elif counted:
                        failed(status)
                except HttpError as exc:
                    if counted:
                        failed(str(exc).split(":")[0])  # counted, and the node keeps polling
                if timed_from <= time.monotonic() < deadline:
                    stats["answered"] += 1
                if counted:
                    stats["requests"] += 1
                    stats["gets"] += 1
                    lat["desired"].append((time.perf_counter() - t) * 1000)
            seq, egress = seq + 1, egress + random.randint(10**6, 10**8)
            data = report_body(node, seq, ops, egress, desired_etag=etag if protocol == "report" else None,
                               with_gpus=protocol == "get" or (seq + gpu_phase) % FULL_GPU_REPORT_EVERY == 0,
                               telemetry=telemetry and (seq + telemetry_phase) % TELEMETRY_EVERY == 0)
            raw = request_bytes("POST", "/agent/v1/report", {
                **auth, "Content-Type": "application/json",
                "X-Node-Signature": base64.b64encode(keys[k].sign(data)).decode()}, data)
            t = time.perf_counter()
            try:
                status, _, body = await pool.request(raw)
                if status != 200:
                    if counted:
                        failed(status)
                elif protocol == "report":
                    answer = json.loads(body)
                    if isinstance(answer.get("desired"), dict):
                        ops = {i["lease_id"]: i["op_id"] for i in answer["desired"]["instances"]}
                        etag = answer["desired_etag"]
                    elif "desired_etag" in answer:
                        stats["not_modified"] += counted
            except HttpError as exc:
                if counted:
                    failed(str(exc).split(":")[0])
            if timed_from <= time.monotonic() < deadline:
                stats["answered"] += 1          # answered inside the counted window
            if not counted:
                continue
            stats["requests"] += 1
            ms = (time.perf_counter() - t) * 1000
            lat["report"].append(ms)
            sent_at.append(t)
            if protocol == "report":
                lat["desired"].append(ms)       # this answer is the node's desired-state poll

    async def count_from_settled():
        await asyncio.sleep(max(0.0, timed_from - time.monotonic()))
        window.update(start=mark(), cpu0=time.process_time(), t0=time.monotonic(), perf0=time.perf_counter())
        sampler.start()

    try:
        await asyncio.gather(count_from_settled(), *(one_node(k, n) for k, n in enumerate(fleet)))
    finally:
        for pool in pools:
            pool.close()
        if sampler.is_alive():
            sampler.stop()
    elapsed, generator_cpu = time.monotonic() - window["t0"], time.process_time() - window["cpu0"]
    await asyncio.sleep(0.6)                    # pg_stat counters are flushed every 500 ms
    end = mark()
    return {**stats, "lat": lat, "elapsed": elapsed, "generator_cpu": generator_cpu, "duration": duration,
            "p99_by_third": _p99_by_third(lat["report"], sent_at, window["perf0"], duration),
            "slices": slices(sampler, sent_at, lat["report"], window["perf0"], window["perf0"] + duration),
            "server": {k: end[k] - window["start"][k] for k in end}}


def _p99_by_third(latencies: list[float], sent_at: list[float], start: float, duration: float) -> list[float]:
    """p99 of the reports sent in each third of the counted window: falling when a backlog
    (the settle's first meetings) drains, flat in a steady state, rising when the server
    cannot keep up."""
    thirds: list[list[float]] = [[], [], []]
    for ms, t in zip(latencies, sent_at, strict=True):
        thirds[min(2, max(0, int(3 * (t - start) / duration)))].append(ms)
    return [percentile(third, 99) if third else 0.0 for third in thirds]


def _pool(base: str, connections: int, timeout: float) -> Pool:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return Pool(host, int(port), connections, timeout)
