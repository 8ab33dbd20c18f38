"""The production stack on this machine, started the way docker-compose.yml
starts it, without Docker Hub: scripts/build-assets.sh (the Dockerfile's build step),
scripts/start.sh migrate|web|worker|outbound|beat (each compose service's command, read from the
compose file), the compose healthcheck commands, and Caddy with the repository's
Caddyfile terminating TLS (internal CA, high loopback ports, its own config and data
dirs) in front of granian with DEBUG=0, on a fresh PostgreSQL database and Redis.

Checked over https through Caddy: pages, admin login, the API, HSTS, the http → https
redirect, a lifecycle tick run by beat + worker (shown on the operator dashboard), and
django-axes locking per client address behind the proxy. Plus `docker compose config`
on the compose file. Runs in CI's PostgreSQL + Redis pass."""
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import redis

from tests import deadlines
from tests.conftest import HAS_REDIS, ON_POSTGRES
from tests.deploy.helpers import (
    COMPOSE,
    ROOT,
    TEST_ONLY_ENV,
    free_port,
    own_redis_url,
    service_command,
    stack_redis_database,
)
from tests.tools import require, require_tool

OPERATOR, CUSTOMER, PASSWORD = "smoke-operator", "smoke-alice", "correct horse battery 9"
OPERATOR_TOTP_KEY = "3132333435363738393031323334353637383930"  # RFC 6238's test key: staff must have TOTP
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"

pytestmark = [pytest.mark.postgres, pytest.mark.redis,
              pytest.mark.skipif(not (ON_POSTGRES and HAS_REDIS),
                                 reason="the production stack needs DATABASE_URL=postgres://… and REDIS_URL")]

SEED = f"""
from django.core.management import call_command
call_command("load_demo", verbosity=0)
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from billing.services import checkout_place_order
from inventory.models import Offer, Site
from rental.models import Image
from rental.services import account_create
operator = User.objects.create_superuser({OPERATOR!r}, password={PASSWORD!r})
from django_otp.plugins.otp_totp.models import TOTPDevice
TOTPDevice.objects.create(user=operator, name="authenticator", key={OPERATOR_TOTP_KEY!r}, confirmed=True)
alice = account_create(username={CUSTOMER!r}, password={PASSWORD!r})
lease, _ = checkout_place_order(customer=alice, offer=Offer.objects.get(slug="rtx-3090"),
    site=Site.objects.first(), term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"),
    ssh_public_key={KEY!r}, pay_from_balance=False, now=timezone.now() - timedelta(hours=2))
print(lease.pk)
"""


def operator_code(stack) -> str:
    """A code from the operator's authenticator that the device takes now. django_otp never takes
    a step twice, and it learns the authenticator's drift from each code it takes (OTP_TOTP_SYNC):
    a code typed at the end of one step and checked in the next moves its window back a step. So
    this is the code of the device's current step, or of the step after the last one it took (the
    next code, which an operator signing in again within a step waits for)."""
    from django_otp.oath import hotp

    (last_t, drift), = stack.query(
        "SELECT d.last_t, d.drift FROM otp_totp_totpdevice d JOIN auth_user u ON u.id = d.user_id"
        " WHERE u.username = %s", OPERATOR)
    step = max(last_t + 1, int(time.time()) // 30 + drift)
    return f"{hotp(bytes.fromhex(OPERATOR_TOTP_KEY), step):06d}"


def wait_for(condition, timeout: float, what: str, procs=()):
    return deadlines.wait_for(condition, timeout, what, every=0.3, alive=procs)


def healthcheck_command(service: str) -> list[str]:
    test = COMPOSE["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD", test
    return test[1:]


@dataclass
class Stack:
    env: dict
    https_port: int
    http_port: int
    database_url: str
    ca_file: Path
    logs: Path
    procs: dict = field(default_factory=dict)

    def run(self, args, timeout=120, check=True, **kw) -> subprocess.CompletedProcess:
        started = time.monotonic()
        result = subprocess.run(args, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        print(f"{' '.join(args)[:60]}: {time.monotonic() - started:.1f} s")
        if check:
            assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
        return result

    def run_together(self, *commands, timeout=300):
        started = time.monotonic()
        procs = [subprocess.Popen(c, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for c in commands]
        for command, proc in zip(commands, procs, strict=True):
            output = proc.communicate(timeout=timeout)[0]
            assert proc.returncode == 0, f"{command}: {output}"
        print(f"{commands}: {time.monotonic() - started:.1f} s")

    def start(self, name, args):
        log = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 - closed at teardown
        self.procs[name] = (subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True), log)

    def log(self, name) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def unhealthy(self, services, **env) -> dict[str, str]:
        """Runs the compose healthchecks of `services` side by side (with `env` over the
        stack's); the failures' output."""
        procs = {s: subprocess.Popen(healthcheck_command(s), cwd=ROOT, env={**self.env, **env}, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True) for s in services}
        outputs = {s: p.communicate(timeout=60)[0] for s, p in procs.items()}
        return {s: outputs[s] for s, p in procs.items() if p.returncode != 0}

    def query(self, sql, *args):
        with psycopg.connect(self.database_url) as conn:
            return conn.execute(sql, args).fetchall()

    def stop(self):
        for proc, _log in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc, log in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            log.close()


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    text: str

    def header(self, name) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


class Browser:
    """One client behind the proxy: its own source address (127.0.0.x) and cookies."""

    def __init__(self, stack: Stack, source="127.0.0.1"):
        self.stack, self.source, self.cookies = stack, source, {}
        self.context = ssl.create_default_context(cafile=str(stack.ca_file))
        self.origin = f"https://localhost:{stack.https_port}"

    def request(self, method, path, form=None, headers=None) -> Response:
        sock = socket.create_connection(("127.0.0.1", self.stack.https_port), timeout=30,
                                        source_address=(self.source, 0))
        conn = http.client.HTTPSConnection("localhost", self.stack.https_port, context=self.context, timeout=30)
        conn.sock = self.context.wrap_socket(sock, server_hostname="localhost")
        headers = {"Host": f"localhost:{self.stack.https_port}", **(headers or {})}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers.update({"Content-Type": "application/x-www-form-urlencoded",
                            "Origin": self.origin, "Referer": self.origin + path})
        try:
            conn.request(method, path, body=body, headers=headers)
            raw = conn.getresponse()
            response = Response(raw.status, raw.getheaders(), raw.read().decode(errors="replace"))
        finally:
            conn.close()
        for cookie in response.header("Set-Cookie"):
            name, _, rest = cookie.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]
        return response

    def get(self, path, **kw) -> Response:
        return self.request("GET", path, **kw)

    def post_form(self, path, form, **kw) -> Response:
        page = self.get(path)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, f"no CSRF token on {path}: {page.status}"
        return self.request("POST", path, form={"csrfmiddlewaretoken": token.group(1), **form}, **kw)


def create_database(admin_url: str) -> tuple[str, str]:
    name = f"smoke_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urllib.parse.urlsplit(admin_url)
    return name, urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def drop_database(admin_url: str, name: str):
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    caddy = require_tool("caddy", "apt-get install caddy (scripts/install-deploy-tools.sh)")
    require(shutil.which("msgfmt") is not None, "gettext (msgfmt) is not installed")
    tmp = tmp_path_factory.mktemp("production")
    admin_url = os.environ["DATABASE_URL"]
    db_name, database_url = create_database(admin_url)
    redis_url = own_redis_url(stack_redis_database())
    port, https_port, http_port, watch_port = free_port(), free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="localhost",
        DATABASE_URL=database_url, REDIS_URL=redis_url,
        VAR_DIR=str(tmp / "data"), STATIC_ROOT=str(tmp / "staticfiles"),
        WEB_BIND=f"127.0.0.1:{port}", HEALTHCHECK_BIND=f"127.0.0.1:{port}",
        PYTHONDONTWRITEBYTECODE="1", WEB_CONCURRENCY="2", CELERY_CONCURRENCY="1", HOST_AGENT_FAKE_DELAY="0",
        LIFECYCLE_INTERVAL_SECONDS="2",  # a beat tick within seconds, not a minute
        SITE_ADDRESS="localhost", CADDY_TLS="internal", UPSTREAM=f"127.0.0.1:{port}",
        WATCH_BIND=f"127.0.0.1:{watch_port}", WATCH_UPSTREAM=f"127.0.0.1:{watch_port}",
        NODE_WATCH_RECHECK_SECONDS="60",  # a watch answered in time was woken by pub/sub, not the recheck
        # The Caddyfile's own default for the admin API (off); reset mails to files
        # (SMTP is the production default).
        HOME=str(tmp / "home"), EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(tmp / "mail"),
        CADDY_HTTPS_PORT=str(https_port), CADDY_HTTP_PORT=str(http_port),
        XDG_DATA_HOME=str(tmp / "caddy-data"), XDG_CONFIG_HOME=str(tmp / "caddy-config"),
    )
    logs = tmp / "logs"
    logs.mkdir()
    (tmp / "home").mkdir()
    stack = Stack(env=env, https_port=https_port, http_port=http_port, database_url=database_url,
                  ca_file=tmp / "caddy-data/caddy/pki/authorities/local/root.crt", logs=logs)
    try:
        # The image's build step and the migrate service need nothing from each other.
        stack.run_together(["scripts/build-assets.sh"], service_command("migrate"))
        # The drip test's customer receiver listens on 127.0.0.1: the services (not migrate's
        # deploy check above, which refuses it) allow private webhook addresses, and cut an
        # attempt at 3 s instead of 15. Nothing else here sends webhooks.
        stack.env.update(WEBHOOK_ALLOW_PRIVATE_ADDRESSES="1", WEBHOOK_ATTEMPT_DEADLINE_SECONDS="3")
        stack.started_at = time.time()
        for service in ("web", "watch", "worker", "outbound", "beat"):
            stack.start(service, service_command(service))
        stack.start("caddy", [caddy, "run", "--config", str(ROOT / "Caddyfile"), "--adapter", "caddyfile"])
        stack.seeded_lease = int(stack.run(["python", "manage.py", "shell", "-c", SEED]).stdout.split()[-1])
        procs = [p for p, _ in stack.procs.values()]
        wait_for(lambda: stack.ca_file.exists(), 60, "Caddy's internal CA", procs)
        wait_for(lambda: https_ok(stack), 60, "https://localhost/healthz through Caddy", procs)
        yield stack
    finally:
        stack.stop()
        redis.Redis.from_url(redis_url).flushdb()
        drop_database(admin_url, db_name)


def https_ok(stack) -> bool:
    try:
        return Browser(stack).get("/healthz").status == 200
    except OSError:
        return False


def test_healthchecks_of_web_workers_and_beat_pass(stack):
    failing = {}

    def all_healthy():
        failing.clear()
        failing.update(stack.unhealthy(["web", "worker", "outbound", "beat"]))
        return not failing

    try:
        wait_for(all_healthy, 60, "the web, worker, outbound and beat healthchecks")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {failing}") from None


def test_beat_healthcheck_fails_on_a_stale_heartbeat(stack):
    heartbeat = Path(stack.env["VAR_DIR"]) / "beat-heartbeat"
    wait_for(heartbeat.exists, 30, "the first beat tick")
    os.kill(stack.procs["beat"][0].pid, signal.SIGSTOP)  # a hung beat: no more ticks
    try:
        old = time.time() - 600
        os.utime(heartbeat, (old, old))
        result = stack.run(healthcheck_command("beat"), check=False)
        # The check reads the clock when its process has started: seconds later on a busy machine.
        age = re.search(r"beat: last tick (\d+) s ago", result.stderr)
        assert result.returncode == 1 and age and 600 <= int(age[1]) <= time.time() - old + 1, result
    finally:
        os.kill(stack.procs["beat"][0].pid, signal.SIGCONT)
    wait_for(lambda: time.time() - heartbeat.stat().st_mtime < 60, 60, "the beat to tick again")
    assert not stack.unhealthy(["beat"])


def test_worker_healthcheck_fails_when_the_lifecycle_pass_stops(stack):
    """A worker that answers pings but does no pass is unhealthy: with beat stopped no tick
    reaches it, and after JOB_STALE_AFTER_INTERVALS (3) × LIFECYCLE_INTERVAL_SECONDS (2 s) its
    healthcheck names the lifecycle pass; healthy again once beat ticks again."""
    wait_for(lambda: not stack.unhealthy(["worker"]), 60, "a healthy worker first")
    outputs = {}

    def worker_unhealthy():
        outputs.update(stack.unhealthy(["worker"]))
        return outputs.get("worker")

    os.kill(stack.procs["beat"][0].pid, signal.SIGSTOP)
    try:
        wait_for(worker_unhealthy, 60, "the worker's healthcheck to fail")
    finally:
        os.kill(stack.procs["beat"][0].pid, signal.SIGCONT)
    assert re.search(r"worker: jobs@\S+ answered, but its work is late: lifecycle: last completed \d+ s ago "
                     r"\(allowed 6 s\)", outputs["worker"]), outputs
    wait_for(lambda: not stack.unhealthy(["worker"]), 60, "the worker to be healthy again")


@pytest.mark.parametrize("path", ["/", "/gpus/", "/size/", "/accounts/login/", "/admin/login/?next=/admin/"])
def test_pages_over_https_with_hsts(stack, path):
    response = Browser(stack).get(path)
    assert response.status == 200, (path, response.status, response.text[:500])
    assert response.header("Strict-Transport-Security") == ["max-age=31536000; includeSubDomains; preload"]
    stylesheet = re.search(r'href="(/static/[\w/.-]+\.[0-9a-f]{12}\.css)"', response.text)
    assert stylesheet, "pages link hashed stylesheets from the manifest built by build-assets.sh"
    assert Browser(stack).get(stylesheet.group(1)).status == 200


def test_api_estimate_over_https(stack):
    response = Browser(stack).get("/api/v1/estimate?model=llama-2-13b&method=lora")
    assert response.status == 200, response.text[:500]
    assert response.header("Content-Type")[0].startswith("application/json")
    assert json.loads(response.text)


def test_plain_http_redirects_to_https(stack):
    conn = http.client.HTTPConnection("127.0.0.1", stack.http_port, timeout=10)
    conn.request("GET", "/gpus/", headers={"Host": "localhost"})
    response = conn.getresponse()
    assert response.status in (301, 308) and response.getheader("Location").startswith("https://localhost")


def test_lifecycle_tick_by_beat_and_worker_shown_to_the_operator(stack):
    def audited():
        events = stack.query("SELECT kind FROM rental_leaseevent WHERE lease_id = %s ORDER BY id", stack.seeded_lease)
        return [kind for (kind,) in events]

    # The key's destruction commits after the cancellation (phase two runs on commit), so
    # the wait is for the whole trail, not for the lease's state.
    trail = ["created", "cancelled", "key_destroy_requested", "key_destroyed"]
    wait_for(lambda: len(audited()) >= len(trail), 60, "beat + worker to expire the unpaid order and destroy its key")
    assert audited() == trail
    assert stack.query("SELECT state FROM rental_lease WHERE id = %s", stack.seeded_lease) == [("cancelled",)]
    # The tick records its finish after the work it did commits, so the board is read once a
    # finish at or after the last start is on record (a loaded machine can take seconds).
    wait_for(lambda: stack.query("SELECT 1 FROM billing_jobrun WHERE name = 'lifecycle' AND "
                                 "last_finished_at >= last_started_at"), 60, "the tick's finish on record")
    operator = Browser(stack)
    login = operator.post_form("/admin/login/?next=/admin/", {"username": OPERATOR, "password": PASSWORD,
                                                              "next": "/admin/"})
    assert login.status == 302, login.text[:500]
    assert all("Secure" in c for c in login.header("Set-Cookie")), login.header("Set-Cookie")
    code = operator.post_form("/accounts/otp/verify/?next=/admin/", {"code": operator_code(stack)})
    assert code.status == 302, code.text[:500]  # the two-factor step every staff account passes
    board = operator.get("/admin/ops/dashboard/")
    assert board.status == 200, board.text[:500]
    row = re.search(r"<tr><td>lifecycle</td><td>([^<]+)</td><td>([^<]+)</td>", board.text)
    assert row and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row.group(2)), board.text[-3000:]
    wait_for(lambda: "billing.lifecycle_tick" in stack.log("worker") and "succeeded" in stack.log("worker"), 20,
             "the worker's log line of the tick")  # written after the tick committed


def test_axes_locks_each_client_behind_the_proxy_separately(stack):
    limit = 5  # AXES_FAILURE_LIMIT
    attacker, neighbour = Browser(stack, source="127.0.0.2"), Browser(stack, source="127.0.0.3")
    for _ in range(limit):
        attacker.post_form("/accounts/login/", {"username": CUSTOMER, "password": "wrong password"})
    locked = attacker.post_form("/accounts/login/", {"username": CUSTOMER, "password": PASSWORD})
    assert locked.status == 429, (locked.status, locked.text[:300])
    # A forged X-Forwarded-For does not get the attacker out: Caddy replaces it.
    forged = attacker.post_form("/accounts/login/", {"username": CUSTOMER, "password": PASSWORD},
                                headers={"X-Forwarded-For": "203.0.113.7"})
    assert forged.status == 429
    # Another client behind the same proxy logs in with the same username.
    welcome = neighbour.post_form("/accounts/login/", {"username": CUSTOMER, "password": PASSWORD})
    assert welcome.status == 302, (welcome.status, welcome.text[:300])
    addresses = stack.query("SELECT DISTINCT host(ip_address) FROM axes_accessattempt WHERE username = %s", CUSTOMER)
    assert addresses == [("127.0.0.2",)]


# --- What the attack did not reach ---------------------------------------------------
def listening(pid: int) -> list[str]:
    """Every socket (TCP, UDP, Unix) process `pid` listens on, as `ss` prints them."""
    out = subprocess.run(["ss", "-lntuxp"], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if f"pid={pid}," in line]


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return [pid] + [d for c in children for d in descendants(c)]


def test_the_access_log_names_the_client_not_the_proxy(stack):
    Browser(stack, source="127.0.0.7").get("/gpus/?from=access-log-test")
    wait_for(lambda: "/gpus/?from=access-log-test" in stack.log("web"), 20, "the access log line")
    [line] = [x for x in stack.log("web").splitlines() if "/gpus/?from=access-log-test" in x]
    assert line.startswith("127.0.0.7 via 127.0.0.1 "), line
    # A client cannot put another address there: Caddy replaces X-Forwarded-For.
    Browser(stack, source="127.0.0.8").get("/gpus/?from=forged", headers={"X-Forwarded-For": "203.0.113.9"})
    wait_for(lambda: "/gpus/?from=forged" in stack.log("web"), 20, "the forged request's line")
    [line] = [x for x in stack.log("web").splitlines() if "/gpus/?from=forged" in x]
    assert line.startswith("127.0.0.8 via ") and "203.0.113.9" not in line, line


def test_a_password_reset_token_never_reaches_the_access_log(stack):
    stack.query("UPDATE auth_user SET email = 'alice@example.org' WHERE username = %s RETURNING id", CUSTOMER)
    browser = Browser(stack, source="127.0.0.9")
    assert browser.post_form("/accounts/password/reset/", {"email": "alice@example.org"}).status == 302
    mail_dir = Path(stack.env["EMAIL_FILE_PATH"])
    wait_for(lambda: mail_dir.exists() and any(mail_dir.iterdir()), 20, "the reset mail")
    text = "".join(p.read_text() for p in mail_dir.iterdir())
    uid, token = re.search(r"/accounts/password/reset/([\w-]+)/([\w-]+)/", text).groups()
    response = browser.get(f"/accounts/password/reset/{uid}/{token}/")
    assert response.status == 302 and "set-password" in response.header("Location")[0]
    redacted = f"/accounts/password/reset/{uid}/[redacted]/"
    wait_for(lambda: redacted in stack.log("web"), 20, "the reset link's access log line")
    log = stack.log("web")
    assert token not in log and redacted in log
    assert "alice@example.org" not in log and "/accounts/password/reset/" not in stack.log("worker")


def test_caddy_has_no_admin_api_listening(stack):
    caddy = stack.procs["caddy"][0].pid
    sockets = listening(caddy)
    ports = {int(m) for line in sockets for m in re.findall(r":(\d+)\s", line)}
    assert ports and ports <= {stack.https_port, stack.http_port}, sockets
    assert not [line for line in sockets if line.startswith("u_")], sockets


def test_the_web_server_has_no_control_socket(stack):
    pids = descendants(stack.procs["web"][0].pid)
    assert len(pids) >= 3, pids             # granian's main process and its two workers
    unix = [line for pid in pids for line in listening(pid) if line.startswith("u_")]
    assert unix == [], unix


SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".chain-tools"}


def files_written_since(root: Path, since: float) -> list[Path]:
    written = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        written += [Path(dirpath, f) for f in filenames if Path(dirpath, f).stat().st_mtime >= since]
    return written


def test_running_stack_writes_only_to_its_data_volume(stack):
    """What the read-only image needs: after the build step, the running services wrote
    nothing in the code or the static files, only in VAR_DIR (the /data volume)."""
    assert files_written_since(ROOT, stack.started_at) == []
    assert files_written_since(Path(stack.env["STATIC_ROOT"]), stack.started_at) == []
    data = {p.name for p in Path(stack.env["VAR_DIR"]).iterdir()}
    assert "beat-heartbeat" in data and all(n == "beat-heartbeat" or n.startswith("celerybeat-schedule")
                                            for n in data), data


def session_niceness(leader: int) -> dict[int, int]:
    """{pid: niceness} of every process in the session `leader` leads (a service's, as
    stack.start starts it), from /proc."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:            # gone since the listing
            continue
        if int(fields[3]) == leader:     # field 6, the session; fields[0] is field 3
            out[int(stat.parent.name)] = int(fields[16])   # field 19, the niceness
    return out


def test_the_customers_requests_take_the_cpu_before_the_nodes_and_the_nodes_before_the_jobs(stack):
    """As the services start (scripts/start.sh, storefront/priority.py): the web at the
    niceness it was started with, every process of the watch (granian's main and its workers)
    at WATCH_NICENESS, the jobs' worker and beat at JOBS_NICENESS; each of the last two leads
    its session, so its autogroup takes the niceness too."""
    from django.conf import settings

    runner = os.getpriority(os.PRIO_PROCESS, 0)
    leaders = {name: stack.procs[name][0].pid for name in ("web", "watch", "worker", "beat")}
    wanted = {"web": runner, "watch": max(runner, settings.WATCH_NICENESS),
              "worker": max(runner, settings.JOBS_NICENESS), "beat": max(runner, settings.JOBS_NICENESS)}
    seen = {}

    def every_process_at_its_niceness():
        seen.update({name: session_niceness(pid) for name, pid in leaders.items()})
        return all(len(seen[name]) >= 2 for name in ("web", "watch")) and all(
            set(seen[name].values()) == {wanted[name]} for name in ("web", "watch")) and all(
            seen[name].get(leaders[name]) == wanted[name] for name in ("worker", "beat"))

    try:
        wait_for(every_process_at_its_niceness, 60, "each service at its niceness")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen}, wanted {wanted}") from None
    for name in ("watch", "worker", "beat"):
        group = Path(f"/proc/{leaders[name]}/autogroup")
        if group.exists():
            assert group.read_text().split()[-1] == str(wanted[name]), (name, group.read_text())


def test_compose_file_is_valid(tmp_path):
    compose = require_tool("docker-compose", "Compose v2: scripts/install-deploy-tools.sh")
    version = subprocess.run([compose, "version"], capture_output=True, text=True, timeout=30).stdout
    require("version v2" in version, f"docker-compose is not Compose v2: {version.strip()}")
    for name in ("docker-compose.yml", "Caddyfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    result = subprocess.run([compose, "--profile", "tools", "config", "--format", "json"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    services = config["services"]
    assert set(services) >= {"db", "redis", "migrate", "web", "watch", "worker", "outbound", "beat", "caddy",
                             "backup"}
    for name in ("web", "worker", "outbound", "beat"):
        assert services[name]["healthcheck"]["test"][1:] == healthcheck_command(name)
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["read_only"] is True
        assert services[name]["environment"]["DEBUG"] == "0"
    assert "ports" not in services["web"] and {p["published"] for p in services["caddy"]["ports"]} >= {"80", "443"}
    # Each service is a cgroup of its own, where a niceness orders only its own threads: the
    # same order between them comes from their CPU weights (WATCH_NICENESS, JOBS_NICENESS).
    shares = {name: services[name].get("cpu_shares", 1024) for name in ("web", "watch", "worker", "outbound", "beat")}
    assert shares["web"] > shares["watch"] > max(shares["worker"], shares["outbound"], shares["beat"]), shares
    # Without the secrets .env must give, the stack does not even configure.
    (tmp_path / ".env").write_text("SITE_ADDRESS=gpus.example.com\nCADDY_TLS=internal\n")
    missing = subprocess.run([compose, "config", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode != 0 and "POSTGRES_PASSWORD" in missing.stderr


ENROL_NODE = f"""
from django.contrib.auth.models import User
from django.utils import timezone
from fleet.services import enrolment_code_create
from inventory.models import Node
node = Node.objects.order_by("pk").first()
print(node.pk, enrolment_code_create(node=node, actor=User.objects.get(username={OPERATOR!r}), now=timezone.now()))
"""


def enrolled_node(stack, key_name: str):
    """The first node enrolled through the proxy as an agent does, holding its desired state:
    (its pk, the agent's client, its key)."""
    from nodeagent.client import StorefrontClient
    from nodeagent.signing import NodeKey

    node_pk, code = stack.run(["python", "manage.py", "shell", "-c", ENROL_NODE]).stdout.split()[-2:]
    origin, ca = f"https://localhost:{stack.https_port}", str(stack.ca_file)
    key = NodeKey.generate(stack.logs / key_name)
    enrolled = StorefrontClient(origin, verify=ca).enrol(code=code, public_key=key.public_key_b64(), hostname="n")
    client = StorefrontClient(origin, credential=enrolled["credential"], verify=ca)
    client.desired()
    return node_pk, client, key


def test_a_node_waiting_through_the_proxy_hears_of_a_change_made_by_another_process(stack):
    """The nodes' watch on its production path: Caddy routes it to the ASGI process
    (`start.sh watch`), and a change committed by another process (a `manage.py shell`, as
    a worker's) reaches it over Redis pub/sub — the recheck is set to 60 s here."""
    import threading

    node_pk, client, _key = enrolled_node(stack, "node-key.pem")
    version = client.desired_version
    assert version
    started = time.monotonic()
    assert client.watch(version, 1.0) is False and time.monotonic() - started >= 1.0   # held, then nothing new
    answer = {}

    def watch():
        answer["changed"] = client.watch(version, 90)
        answer["at"] = time.monotonic()

    waiting = threading.Thread(target=watch)
    waiting.start()
    change = time.monotonic()
    stack.run(["python", "manage.py", "shell", "-c",
               f"from fleet.desired_version import desired_changed; desired_changed([{node_pk}])"])
    changed = time.monotonic()
    waiting.join(deadlines.scaled(60))
    assert answer.get("changed") is True, answer
    print(f"\nwatch answered {(answer['at'] - changed) * 1000:+.0f} ms after the changing process exited "
          f"({(answer['at'] - change):.1f} s after it started)")
    assert answer["at"] - change < 45        # pub/sub, not the 60 s recheck
    assert "/agent/v1/desired/watch" not in stack.log("web")


def test_a_report_that_waits_through_the_proxy_is_taken_at_once_and_answered_on_a_change(stack):
    """The report that waits on its production path: Caddy routes it to the ASGI process with
    its body, the report is taken (its seq is spent), and a change committed by another
    process ends the hold with the new version (had the change come first, it is answered at
    once with it)."""
    import threading

    from nodeagent.client import StorefrontRefused

    node_pk, client, key = enrolled_node(stack, "node-key-2.pem")
    version = client.desired_version

    def report(seq: int) -> dict:
        return {"seq": seq, "sent_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "agent_version": "0.1.0",
                "public_host": "203.0.113.7", "gpu_library": "nvml", "instances": []}

    answer = {}

    def held():
        answer["body"] = client.report(report(1), key, wait_from=(version, 90))
        answer["at"], answer["version"] = time.monotonic(), client.desired_version

    waiting = threading.Thread(target=held)
    waiting.start()
    change = time.monotonic()
    stack.run(["python", "manage.py", "shell", "-c",
               f"from fleet.desired_version import desired_changed; desired_changed([{node_pk}])"])
    waiting.join(deadlines.scaled(60))
    assert answer.get("version") not in (None, "", version), answer
    assert answer["body"]["refused"] == []
    print(f"\nthe held report answered {(answer['at'] - change):.1f} s after the change began")
    assert answer["at"] - change < 45        # pub/sub, not the 60 s recheck
    with pytest.raises(StorefrontRefused) as replayed:                   # it was taken
        client.report(report(1), key)
    assert (replayed.value.status, replayed.value.error) == (409, "replayed")
    assert "/agent/v1/report/watch" not in stack.log("web")


# --- the live attacks, on the stack (docs/adr/0010-*) -------------------------------------------

def test_guesses_from_many_addresses_never_keep_the_operator_out(stack):
    """The reported attack on the production stack: 20 wrong passwords for the operator from
    10 addresses behind the proxy. The attacker's addresses are then paced (429, Retry-After,
    the password not even checked); the operator, on a new browser at a new address, gets in
    at the first try with the password and the TOTP code, and again while the attack goes on."""
    for n in range(20):
        guess = Browser(stack, source=f"127.0.5.{n // 2 + 1}").post_form(
            "/admin/login/?next=/admin/", {"username": OPERATOR, "password": f"guess {n}", "next": "/admin/"})
        assert guess.status == 200, (n, guess.status, guess.text[:300])
    attacker = Browser(stack, source="127.0.5.1")
    attacker.post_form("/admin/login/?next=/admin/", {"username": OPERATOR, "password": "again", "next": "/admin/"})
    paced = attacker.post_form("/admin/login/?next=/admin/", {"username": OPERATOR, "password": PASSWORD,
                                                              "next": "/admin/"})
    assert paced.status == 429 and 0 < int(paced.header("Retry-After")[0]) <= 60, (paced.status, paced.text[:300])
    assert "password was not checked" in paced.text
    for source in ("127.0.6.1", "127.0.6.2"):
        owner = Browser(stack, source=source)
        login = owner.post_form("/admin/login/?next=/admin/", {"username": OPERATOR, "password": PASSWORD,
                                                               "next": "/admin/"})
        assert login.status == 302, (source, login.status, login.text[:300])
        code = owner.post_form("/accounts/otp/verify/?next=/admin/", {"code": operator_code(stack)})
        assert code.status == 302, (source, code.status, code.text[:300])
        assert owner.get("/admin/").status == 200
        Browser(stack, source="127.0.5.9").post_form(   # the attack goes on
            "/admin/login/?next=/admin/", {"username": OPERATOR, "password": "more", "next": "/admin/"})


def test_a_dripping_webhook_receiver_never_stalls_the_lifecycle_pass(stack):
    """A customer points their webhook at a receiver that answers a byte every half second
    and sends test events from the settings page, through Caddy and granian: the outbound
    worker's attempts are cut at the deadline (3 s here), and all the while beat and the jobs
    worker keep completing the lifecycle pass every LIFECYCLE_INTERVAL_SECONDS (2 s here), and
    the jobs worker stays healthy."""
    from tests.automation.drip import Drip, max_overlap

    interval, deadline = 2.0, 3.0
    drip = Drip(every=0.5)
    customer = Browser(stack, source="127.0.7.1")
    try:
        assert customer.post_form("/accounts/login/", {"username": CUSTOMER, "password": PASSWORD}).status == 302

        def post(path, form):
            page = customer.get("/account/settings/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
            return customer.request("POST", path, form={"csrfmiddlewaretoken": token, **form})

        saved = post("/account/webhooks/", {"url": f"{drip.url}/alice"})
        assert saved.status in (200, 302), (saved.status, saved.text[-500:])
        for _ in range(4):
            assert post("/account/webhooks/test/", {}).status == 302
        finished, connections = set(), []

        def lifecycle_seen():
            finished.update(row[0] for row in stack.query(
                "SELECT last_finished_at FROM billing_jobrun WHERE name = 'lifecycle'") if row[0])
            connections[:] = [c for c in drip.snapshot() if c.closed is not None]   # retries may follow
            return len(connections) >= 4

        wait_for(lifecycle_seen, 120, "four dripping attempts, each cut at the deadline")
        # the healthcheck's allowance (3 intervals) stretched by the load like every deadline
        # here: a pass 7 s after the last at load 4 is the machine, not the drip (the gaps say)
        assert not stack.unhealthy(["worker"], JOB_STALE_AFTER_INTERVALS=str(3 * deadlines.load_factor()))
    finally:
        drip.close()
    durations = [c.closed - c.opened for c in connections]
    assert all(c.closed_by_client for c in connections) and max(durations) < deadline + deadlines.scaled(1.5)
    assert max_overlap(connections) <= 2          # WEBHOOK_CONCURRENCY_PER_ACCOUNT
    busy = (min(c.opened for c in connections), max(c.closed for c in connections))
    inside = [busy[0]] + sorted(t.timestamp() for t in finished if busy[0] < t.timestamp() < busy[1]) + [busy[1]]
    gaps = [b - a for a, b in zip(inside, inside[1:], strict=False)]
    print(f"\nstack: receivers busy {busy[1] - busy[0]:.1f} s, lifecycle passes in it {len(inside) - 2}, "
          f"longest gap {max(gaps):.2f} s (interval {interval:g} s)")
    assert busy[1] - busy[0] > deadline and max(gaps) < interval + deadlines.scaled(2.0), gaps
