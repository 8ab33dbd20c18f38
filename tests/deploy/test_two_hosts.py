"""Two storefront hosts against one PostgreSQL and one Redis (docs/operations/high-availability.md §3).

Each host is what docker-compose.yml runs on one machine — web (granian, scripts/start.sh web),
the jobs worker and beat, each started by its compose command — with its own port and its own
data directory (VAR_DIR: beat's schedule and heartbeat), both on the test database and on a
Redis of their own (this test flushes it). A client, like a load balancer, sends every request
to the hosts in turn and to the other one when a host does not answer: a node's desired-state
poll, a customer page, and API writes (a saved SSH key added, then deleted). Meanwhile both
beats tick the lifecycle pass every second, so the two hosts' passes contend for the lock all
the time; the host agent records the polls each pass makes (tests/deploy/hosts_probe.py).

In order: both hosts serve; Redis is flushed (FLUSHDB: broker queues, cache, throttles, the
fleet's seq entries) and the store goes on, renewing leases that fell due after the flush; host
A is stopped (SIGTERM, as `docker compose stop` does) and B goes on alone; A comes back and B
is killed (SIGKILL: a machine lost) and A goes on alone. Then: every request that was answered
is in the database, no answer was a server error, both hosts answered polls and pages, every
renewal happened once, and the pass records show whole passes, never two at once, with a pass
after each event within the lock's expiry and an interval."""
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.db import transaction
from django.utils import timezone

from billing.models import Invoice, LedgerEntry
from inventory.models import Node, Site
from ops.lifecycle.locks import exclusive
from rental.accounts.services import api_token_create
from rental.models import Lease, LeaseEvent, LeaseState, SshKey
from tests import deadlines
from tests.billing.celery_workers import database_url, due_leases
from tests.billing.races import PRICE, order
from tests.conftest import ON_POSTGRES
from tests.deploy.helpers import TEST_ONLY_ENV, free_port, service_command
from tests.factories import new_customer
from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
S = LeaseState
PROBES = 6               # probe leases: one pass = 6 polls of PROBE_POLL_SECONDS each
INTERVAL = 1.0           # LIFECYCLE_INTERVAL_SECONDS of both beats
LOCK = 3.0               # LIFECYCLE_LOCK_SECONDS: a killed holder blocks the passes this long at most
PROCESSES = ("web", "worker", "beat")
#: What the TLS proxy in front of the hosts (Caddyfile) adds to every request it passes on.
PROXIED = {"Host": "127.0.0.1", "X-Forwarded-Proto": "https"}

pytestmark = [pytest.mark.infra, pytest.mark.postgres, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not ON_POSTGRES, reason="two hosts share a PostgreSQL: DATABASE_URL=postgres://…")]


def due_between_passes() -> list[Lease] | None:
    """Nine leases paid and provisioned 8 days ago (a week's term: past its end), committed while
    no lifecycle pass runs (None while one does). A pass commits each sweep's batch on its own,
    so leases committed already past their end between its renewal sweep and its suspension
    sweep would be suspended before their renewal was tried; in a store no lease becomes due
    mid-pass, its renewal comes LEASE_RENEWAL_LEAD_HOURS before its end."""
    with exclusive("lifecycle", ttl=timedelta(seconds=LOCK)) as held:
        if not held:
            return None
        with transaction.atomic():
            return due_leases(9, timezone.now().replace(microsecond=0) - timedelta(days=8), "flushed")


def wait_for(condition, timeout: float, what: str, detail=None):
    return deadlines.wait_for(condition, timeout, what, every=0.1, detail=detail)


@dataclass
class Host:
    """One machine's storefront: web, jobs worker and beat, its own port and data directory."""
    name: str
    env: dict
    port: int
    root: Path
    procs: dict = field(default_factory=dict)

    def start(self) -> None:
        for process in PROCESSES:
            log = open(self.root / f"{process}.log", "a")  # noqa: SIM115 - closed in stop()
            self.procs[process] = (subprocess.Popen(service_command(process), cwd=ROOT, env=self.env, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True), log)

    def ready(self) -> bool:
        for process, (proc, _log) in self.procs.items():
            assert proc.poll() is None, f"host {self.name}: {process} exited\n{self.logs()}"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/healthz", headers=PROXIED)
            return conn.getresponse().status == 200 and "ready." in (self.root / "worker.log").read_text()
        except OSError:
            return False

    def stop(self, sig: int) -> None:
        """SIGTERM: to each main process, as `docker compose stop` does, then waits for it;
        SIGKILL: to every process of the host at once, as a machine that is lost."""
        for proc, _log in self.procs.values():
            if proc.poll() is None:
                (os.killpg if sig == signal.SIGKILL else os.kill)(proc.pid, sig)
        for process, (proc, log) in self.procs.items():
            try:
                proc.wait(deadlines.scaled(30))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                raise AssertionError(f"host {self.name}: {process} ignored {sig!r}\n{self.logs()}") from None
            finally:
                log.close()
        for proc, _log in self.procs.values():  # what a main process left (prefork children)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()

    def logs(self) -> str:
        return "\n".join(f"--- {self.name}/{p}.log\n{(self.root / f'{p}.log').read_text(errors='replace')[-1500:]}"
                         for p in PROCESSES if (self.root / f"{p}.log").exists())


def ssh_key_line() -> str:
    return Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


class Client(threading.Thread):
    """Round after round: a node's poll, a customer page, an API key added, one deleted. Each
    request goes to the next host in turn, and to the other when one does not answer (a
    refused or broken connection, as a load balancer retries). Records every answer."""

    def __init__(self, ports: dict[str, int], token: str, credential: str):
        super().__init__(daemon=True)
        self.ports, self.token, self.credential = ports, token, credential
        self.answers: list[tuple[str, str, int, dict]] = []   # (host, kind, status, body or headers)
        self.unanswered: Counter = Counter()
        self.added: dict[int, str] = {}      # key id -> the host that answered 201
        self.deleted: set[int] = set()       # key ids whose DELETE was answered 200
        self.stopped, self.turns, self.failure = threading.Event(), Counter(), None

    def call(self, kind: str, method: str, path: str, headers: dict, body: bytes | None = None):
        hosts, turn = list(self.ports), self.turns[kind] % len(self.ports)
        self.turns[kind] += 1   # each kind of request to each host in turn
        for host in hosts[turn:] + hosts[:turn]:
            conn = http.client.HTTPConnection("127.0.0.1", self.ports[host], timeout=deadlines.scaled(15))
            try:
                conn.request(method, path, body=body, headers={**PROXIED, **headers})
                response = conn.getresponse()
                text = response.read()
            except OSError:  # refused, reset, closed mid-answer: not answered, try the other host
                self.unanswered[(host, kind)] += 1
                continue
            finally:
                conn.close()
            data = json.loads(text) if response.getheader("Content-Type", "").startswith("application/json") else {}
            self.answers.append((host, kind, response.status, {"etag": response.getheader("ETag"), **data}))
            return host, response.status, data
        return None, None, None

    def one_round(self) -> None:
        self.call("poll", "GET", "/agent/v1/desired", {"Authorization": f"Node {self.credential}"})
        self.call("page", "GET", "/gpus/", {})
        api = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        body = json.dumps({"name": f"k-{secrets.token_hex(4)}", "public_key": ssh_key_line()}).encode()
        host, status, data = self.call("add", "POST", "/api/v1/keys", api, body)
        if status == 201:
            self.added[data["id"]] = host
        live = sorted(set(self.added) - self.deleted)
        if len(live) > 5:
            _host, status, _data = self.call("delete", "DELETE", f"/api/v1/keys/{live[0]}", api)
            if status == 200:
                self.deleted.add(live[0])

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                self.one_round()
        except Exception as exc:  # surfaced by the test
            self.failure = exc

    def served(self, host: str, kind: str) -> int:
        return sum(1 for h, k, status, _ in self.answers if h == host and k == kind and status < 400)


def passes(probe_file: Path, order: list[int]) -> list[tuple[str, int, int, list[int]]]:
    """The probe's lines as runs of one process: (host, pid, first time_ns, lease ids)."""
    runs: list[tuple[str, int, int, list[int]]] = []
    lines = probe_file.read_text().split("\n") if probe_file.exists() else []
    for line in lines:
        if not line:
            continue
        at, host, pid, lease = line.split()
        if runs and runs[-1][:2] == (host, int(pid)):
            runs[-1][3].append(int(lease))
        else:
            runs.append((host, int(pid), int(at), [int(lease)]))
    return runs


def pass_starts(probe_file: Path, order: list[int], host: str | None = None) -> list[int]:
    """When each pass began (time_ns), from each run's chunks of len(order) polls."""
    n = len(order)
    starts = []
    lines = [line.split() for line in probe_file.read_text().split("\n") if line] if probe_file.exists() else []
    by_process = defaultdict(list)
    for at, h, pid, lease in lines:
        by_process[(h, pid)].append((int(at), int(lease)))
    for (h, _pid), polls in by_process.items():
        if host is None or h == host:
            starts += [at for at, lease in polls if lease == order[0]]
    assert n
    return sorted(starts)


@pytest.fixture
def redis_server(tmp_path):
    """A Redis of the test's own: it is flushed mid-run."""
    server = require_tool("redis-server", "apt-get install redis-server")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, start_new_session=True)
    client = redis.Redis(port=port)
    try:
        wait_for(lambda: proc.poll() is None and client.ping(), 20, "redis-server",
                 detail=lambda: f"exit {proc.poll()}")
    except redis.ConnectionError:
        pass
    wait_for(lambda: _pings(client), 20, "redis-server to answer")
    yield f"redis://127.0.0.1:{port}/0", client
    client.close()
    proc.terminate()
    proc.wait(10)


def _pings(client) -> bool:
    try:
        return client.ping()
    except redis.ConnectionError:
        return False


def test_two_hosts_serve_in_turn_and_one_lost_loses_nothing(catalog, redis_server, tmp_path):
    redis_url, redis_client = redis_server
    started = time.monotonic()
    # --- the data both hosts serve, written here, committed at once ---
    sites = list(Site.objects.all())
    prober = new_customer("probe", balance=PROBES * PRICE)
    probes = [order(prober, timezone.now(), site=sites[i % len(sites)])[0].pk for i in range(PROBES)]
    assert set(Lease.objects.filter(pk__in=probes).values_list("state", flat=True)) == {S.PROVISIONING}
    customer = new_customer("two-hosts")
    token = api_token_create(customer=customer, name="client", scopes=("read", "order"))[1]
    credential = enrol_node()

    static = tmp_path / "static"
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
        PYTHONDONTWRITEBYTECODE="1", DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1",
        DATABASE_URL=database_url(), REDIS_URL=redis_url, STATIC_ROOT=str(static),
        HOST_AGENT="tests.deploy.hosts_probe.ProbeAgent", PROBE_FILE=str(tmp_path / "passes"),
        PROBE_LEASES=",".join(map(str, probes)), PROBE_POLL_SECONDS="0.05",
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend", EMAIL_FILE_PATH=str(tmp_path / "mail"),
        WEB_CONCURRENCY="1", WEB_THREADS="2", CELERY_CONCURRENCY="2",
        LIFECYCLE_INTERVAL_SECONDS=str(INTERVAL), LIFECYCLE_LOCK_SECONDS=str(LOCK),
        PAYMENT_WATCH_INTERVAL_SECONDS="3600", RATES_REFRESH_INTERVAL_SECONDS="3600",
        API_REQUESTS_PER_IP_PER_MINUTE="100000", API_REQUESTS_PER_TOKEN_PER_MINUTE="100000",
        NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE="100000",
    )
    # The image's build step (static files), once for both hosts: their code is the same image.
    build = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT,
                           env={**env, "VAR_DIR": str(tmp_path / "build")}, capture_output=True, text=True,
                           timeout=deadlines.scaled(120))
    assert build.returncode == 0, build.stderr
    hosts = {}
    for name in ("a", "b"):
        port = free_port()
        (tmp_path / name).mkdir()
        hosts[name] = Host(name, {**env, "VAR_DIR": str(tmp_path / name / "data"), "WEB_BIND": f"127.0.0.1:{port}",
                                  "HEALTHCHECK_BIND": f"127.0.0.1:{port}", "PROBE_HOST": name}, port, tmp_path / name)
    probe_file = Path(env["PROBE_FILE"])
    client = Client({name: host.port for name, host in hosts.items()}, token, credential)
    events: dict[str, int] = {}

    def new_passes(after_ns: int, host: str | None = None, count: int = 2):
        return lambda: len([t for t in pass_starts(probe_file, probes, host) if t > after_ns]) >= count

    def serves(host: str, since: dict[tuple[str, str], int], more: int = 3):
        def served() -> bool:
            assert client.failure is None, f"the client broke off: {client.failure!r}"
            return all(client.served(host, kind) >= since.get((host, kind), 0) + more
                       for kind in ("poll", "page", "add"))
        return served

    def served_now() -> dict:
        return {(h, k): client.served(h, k) for h in hosts for k in ("poll", "page", "add")}

    def detail() -> str:
        answers = Counter((h, k, status) for h, k, status, _d in client.answers)
        return "\n".join(host.logs() for host in hosts.values()) + f"\nanswers {dict(answers)}\n" \
            f"unanswered {dict(client.unanswered)}\nclient failure {client.failure!r}"

    try:
        for host in hosts.values():
            host.start()
        wait_for(lambda: all(h.ready() for h in hosts.values()), 60, "both hosts' web and worker", detail)
        client.start()
        # Both hosts answer every kind of request; passes run.
        wait_for(lambda: serves("a", {})() and serves("b", {})() and new_passes(0)(), 40,
                 "both hosts serving and lifecycle passes", detail)

        # Redis flushed: the store goes on (cache misses, queues emptied, throttles reset)
        # and leases that fall due after the flush are renewed (or suspended) once each.
        before = served_now()
        events["flush"] = time.time_ns()
        redis_client.flushdb()
        due = wait_for(due_between_passes, 40, "a moment between two lifecycle passes", detail)
        wait_for(lambda: LeaseEvent.objects.filter(lease__in=due, kind__in=["extended", "suspended"]).count() >= 9
                 and new_passes(events["flush"])() and serves("a", before)() and serves("b", before)(), 40,
                 "renewals, passes and answers from both hosts after FLUSHDB", detail)

        # Host A stopped as `docker compose stop` does: B answers alone and runs the passes.
        events["term a"] = time.time_ns()
        hosts["a"].stop(signal.SIGTERM)
        before = served_now()
        wait_for(lambda: serves("b", before)() and new_passes(events["term a"], "b")(), 40,
                 "host B alone after A's SIGTERM", detail)

        # A comes back; B is lost (SIGKILL, mid-pass or not): A answers alone, and its passes
        # start once the lock B may have held expires.
        hosts["a"].start()
        wait_for(hosts["a"].ready, 60, "host A back", detail)
        events["kill b"] = time.time_ns()
        hosts["b"].stop(signal.SIGKILL)
        events["b killed"] = time.time_ns()  # a pass of B may begin until the kill reaches its worker
        before = served_now()
        wait_for(lambda: serves("a", before)() and new_passes(events["kill b"], "a")(), 40,
                 "host A alone after B's SIGKILL", detail)
    finally:
        client.stopped.set()
        if client.is_alive():
            client.join(deadlines.scaled(30))
        for host in hosts.values():
            if host.procs:
                host.stop(signal.SIGTERM)
    assert client.failure is None, repr(client.failure)
    print(f"two hosts: {len(client.answers)} answers ({Counter((h, k) for h, k, *_ in client.answers)}), "
          f"unanswered {dict(client.unanswered)}, {time.monotonic() - started:.1f} s")

    # No answer was a server error, and each host answered polls, pages and writes.
    statuses = Counter((kind, status) for _h, kind, status, _d in client.answers)
    assert set(statuses) <= {("poll", 200), ("page", 200), ("add", 201), ("delete", 200)}, statuses
    # A node's poll: the same document from either host.
    etags = {host: {d["etag"] for h, k, _s, d in client.answers if h == host and k == "poll"} for host in hosts}
    assert etags["a"] & etags["b"], etags

    # Every answered write is in the database: each key added is there unless its delete was answered.
    present = set(SshKey.objects.filter(customer=customer).values_list("pk", flat=True))
    assert client.added and client.deleted
    assert set(client.added) - client.deleted <= present, "an answered add is missing"
    assert not (client.deleted & present), "an answered delete is not in the database"

    # Renewals after the flush: each lease once.
    kinds = Counter(LeaseEvent.objects.filter(lease__in=due).values_list("kind", flat=True))
    assert kinds["extended"] == 3 and kinds["suspended"] == 6, kinds
    assert Invoice.objects.filter(kind="renewal", lease__in=due).count() == 9
    assert LedgerEntry.objects.filter(kind="renewal", account__customer__in=[d.customer_id for d in due]).count() == 3

    # The passes: runs of one process, each whole passes in the sweep's order (never two at
    # once), except the last run of a process SIGKILLed mid-pass.
    runs = passes(probe_file, probes)
    assert runs, "no pass was recorded"
    last_of_process = {(host, pid): i for i, (host, pid, _at, _l) in enumerate(runs)}
    for i, (host, pid, at, leases) in enumerate(runs):
        chunks = [leases[k:k + PROBES] for k in range(0, len(leases), PROBES)]
        whole = all(chunk == probes for chunk in chunks[:-1])
        cut = chunks[-1] == probes[:len(chunks[-1])] and last_of_process[(host, pid)] == i \
            and host == "b" and at < events["b killed"]
        assert whole and (chunks[-1] == probes or cut), f"passes overlapped or broke off: {runs[max(0, i - 2):i + 3]}"
    hosts_with_passes = {host for host, *_ in runs}
    assert hosts_with_passes == {"a", "b"}, hosts_with_passes
    starts = pass_starts(probe_file, probes)
    gaps = [(b - a) / 1e9 for a, b in zip(starts, starts[1:], strict=False)]
    print(f"lifecycle: {len(starts)} passes on hosts {sorted(hosts_with_passes)}, longest gap {max(gaps):.1f} s")


def enrol_node() -> str:
    """One enrolled node (as bench/fleet_nodes.py enrols them): its agent's credential."""
    import base64

    from fleet.crypto import secret_hash
    from fleet.models import NodeAgent
    from inventory.models import GpuModel

    node = Node.objects.create(site=Site.objects.first(), name="two-hosts-node", gpu_model=GpuModel.objects.first(),
                               gpu_count=8, vcpus=128, host_ram_gb=1024)
    credential = secrets.token_hex(24)
    public = base64.b64encode(Ed25519PrivateKey.generate().public_key().public_bytes(
        Encoding.Raw, PublicFormat.Raw)).decode()
    NodeAgent.objects.create(node=node, credential_hash=secret_hash(credential), public_key=public,
                             enrolled_at=timezone.now(), last_seq=0, agent_version="0.1.0", hostname=node.name,
                             gpu_library="nvml")
    return credential

