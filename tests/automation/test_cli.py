"""The `gpu-rent` client against the live test server over real HTTP (pytest-
django's live_server), in process for speed and as a subprocess where it execs (ssh) or
waits while the lifecycle runs (create --wait). test_installs_alone_without_django puts it
in a fresh venv with nothing but its own dependencies."""
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone
from gpu_rent import errors

from billing.models import Invoice
from billing.services import balance_top_up
from ops.lifecycle import run_lifecycle
from rental.accounts.services import ssh_key_add
from rental.models import Lease, SshKey
from tests.billing.payments_helpers import offline_coins, set_rate

from .helpers import CLI_DIR, KEY, _subprocess_env, active_lease, login

pytestmark = pytest.mark.django_db(transaction=True)


def test_login_stores_the_token_0600_and_whoami_uses_it(cli, catalog, customer):
    token = login(cli, customer)
    path = cli.config / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(cli.config.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": cli.url, "token": token}
    code, out, _ = cli("whoami", "--json")
    assert code == 0 and json.loads(out)["username"] == "alice"
    assert json.loads(out)["token"]["scopes"] == ["manage", "order", "pay", "read"]
    code, _out, err = cli("login", "--url", cli.url, "--token-stdin", stdin="gpr_not-a-token\n")
    assert code == errors.NOT_LOGGED_IN and "valid API token" in err
    assert cli("logout")[0] == 0 and not path.exists()
    assert cli("ls", "--url", cli.url)[0] == errors.NOT_LOGGED_IN


def test_offers_filters_sort_table_and_json(cli, catalog):
    code, out, _ = cli("offers", "--url", cli.url, "--json", "--min-vram", "40", "--sort", "price", "--desc")
    offers = json.loads(out)["offers"]
    assert code == 0 and offers and all(o["vram_gb"] >= 40 for o in offers)
    prices = [o["weekly_cents"] for o in offers]
    assert prices == sorted(prices, reverse=True)
    code, out, _ = cli("--url", cli.url, "offers", "--gpu", "3090", "--site", "DFW-1")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["OFFER", "GPU", "GPUS"] and "rtx-3090" in out
    assert all("3090" in line for line in lines[1:])


def test_estimate_passes_the_calculator_inputs(cli, catalog):
    code, out, _ = cli("estimate", "--url", cli.url, "--json", "--params", "7", "--method", "qlora", "--seq", "2048")
    result = json.loads(out)
    assert code == 0 and result["method"] == "qlora" and result["per_gpu_gb"] > 0
    code, _out, err = cli("estimate", "--url", cli.url, "--method", "nonsense")
    assert code == errors.INVALID and err


def test_create_from_balance_ls_show_extend_instance_actions_and_refund(cli, catalog, customer, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=50_000, now=timezone.now())
    login(cli, customer)
    key_file = cli.config.parent / "id.pub"
    key_file.write_text(KEY + "\n")
    assert cli("keys", "add", "laptop", str(key_file))[0] == 0
    code, out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--key", "laptop",
                         "--json")
    placed = json.loads(out)
    assert code == 0, err
    assert placed["invoice"]["state"] == "paid" and placed["lease"]["state"] == "provisioning"
    lease_id = placed["lease"]["id"]
    run_lifecycle(timezone.now())
    code, out, _ = cli("ls")
    assert code == 0 and str(lease_id) in out and "active" in out and "ssh -p" in out
    shown = json.loads(cli("show", str(lease_id), "--json")[1])
    assert shown["state"] == "active" and [e["kind"] for e in shown["events"]][:3] == ["created", "paid",
                                                                                        "provisioned"]
    code, out, _ = cli("extend", str(lease_id), "--pay", "balance", "--json")
    extended = json.loads(out)
    assert code == 0 and extended["invoice"]["kind"] == "renewal" and extended["invoice"]["state"] == "paid"
    assert extended["lease"]["ends_at"] > shown["ends_at"]
    assert cli("stop", str(lease_id))[0] == 0
    code, out, _ = cli("start", str(lease_id), "--json")
    assert code == 0 and json.loads(out)["action"] == "start"
    assert cli("restart", str(lease_id))[0] == 0
    assert cli("restart", "999999")[0] == errors.NOT_FOUND
    assert cli("auto-renew", str(lease_id), "off")[0] == 0
    assert Lease.objects.get(pk=lease_id).auto_renew is False
    code, out, _ = cli("invoices", "--state", "paid", "--json")
    assert {i["kind"] for i in json.loads(out)["invoices"]} == {"order", "renewal"}
    code, out, _ = cli("refund", str(lease_id), "--yes", "--json")
    assert code == 0 and json.loads(out)["refunded_cents"] > 0
    code, _out, err = cli("refund", str(lease_id), "--yes")
    assert code == errors.REFUSED and err


def test_create_unpaid_prints_the_invoice_and_crypto_payment_details(cli, catalog, customer):
    login(cli, customer, scopes=("read", "order"))
    ssh_key_add(customer=customer, name="only", public_key=KEY)
    set_rate("LTC", "80", timezone.now())
    with offline_coins():
        code, out, err = cli("create", "--gpu", "rtx 3090", "--site", "dfw-1", "--cycle", "month", "--coin", "LTC")
    assert code == 0, err
    invoice = Invoice.objects.get(customer=customer, kind="order")
    quote = invoice.quotes.get()
    assert f"Invoice #{invoice.pk}" in out and f"/pay/invoice/{invoice.pk}/" in out
    assert quote.address in out and "LTC" in out and quote.uri in out
    code, _out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--pay", "balance")
    assert code == errors.FORBIDDEN  # this token may order but not pay


def test_failure_classes_have_their_exit_codes(cli, catalog, customer, live_server):
    login(cli, customer)
    assert cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week")[0] == errors.USAGE  # no key
    ssh_key_add(customer=customer, name="k", public_key=KEY)
    assert cli("create", "--gpu", "no-such-gpu", "--site", "DFW-1", "--cycle", "week")[0] == errors.NOT_FOUND
    code, out, err = cli("create", "--gpu", "3090", "--site", "NOPE-1", "--cycle", "week", "--json")
    assert code == errors.INVALID and json.loads(out)["exit_code"] == errors.INVALID and "site" in err
    code, _out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--pay", "balance")
    assert code == errors.PAYMENT and "Balance" in err
    assert cli("show", "12345")[0] == errors.NOT_FOUND
    assert cli("ls", "--url", "http://127.0.0.1:9")[0] == errors.NOT_LOGGED_IN  # the token is not sent elsewhere
    code, _out, _err = cli("offers", "--url", "http://127.0.0.1:9")
    assert code == errors.UNREACHABLE
    assert cli("create", "--site", "DFW-1")[0] == errors.USAGE  # argparse: --cycle missing


def test_create_has_no_snapshot_addon(cli, catalog, customer):
    """Snapshots are taken from a running lease: `create` no longer takes --snapshot-tb."""
    login(cli, customer)
    ssh_key_add(customer=customer, name="k", public_key=KEY)
    code, _out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--snapshot-tb", "1")
    assert code == errors.USAGE and "--snapshot-tb" in err
    assert not Lease.objects.exists()


def test_keys_volumes_snapshots(cli, catalog, customer, other_customer):
    login(cli, customer)
    ssh_key_add(customer=other_customer, name="bobs", public_key=KEY)
    assert cli("keys", "add", "mine", "-", stdin=KEY + "\n")[0] == 0
    code, _out, err = cli("keys", "add", "bad", "-", stdin="ssh-rsa AAAA nonsense\n")
    assert code == errors.INVALID and err
    code, out, _ = cli("keys", "ls", "--json")
    assert [k["name"] for k in json.loads(out)["keys"]] == ["mine"]
    assert cli("keys", "rm", "bobs")[0] == errors.NOT_FOUND
    assert cli("keys", "rm", "mine")[0] == 0
    assert not SshKey.objects.filter(customer=customer).exists() and SshKey.objects.filter(name="bobs").exists()
    code, out, _ = cli("volumes", "--json")
    assert code == 0 and json.loads(out) == {"volumes": []}
    code, out, _ = cli("snapshots")
    assert code == 0 and out.split() == ["ID", "LEASE", "REGION", "TB", "STATE", "PAID", "UNTIL"]


def test_ssh_execs_ssh_with_the_connection_line(cli, catalog, customer, tmp_path):
    lease = active_lease(customer, timezone.now())
    login(cli, customer)
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text(f"#!/bin/sh\necho \"$0 $*\" > {tmp_path}/argv\nexit 7\n")
    fake_ssh.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "gpu_rent", "ssh", str(lease.pk), "--", "-L", "8888:localhost:8888"],
                          env=_subprocess_env(cli, GPU_RENT_SSH=str(fake_ssh)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 7  # ssh's own exit code: the client exec'd it
    assert (tmp_path / "argv").read_text().split()[1:] == ["-p", str(lease.ssh_port), f"root@{lease.host}", "-L",
                                                           "8888:localhost:8888"]


@pytest.fixture
def one_at_a_time(monkeypatch):
    """The live server's requests and the test's own database work (the lifecycle it runs
    while the client waits) take turns: SQLite's shared in-memory test database locks
    whole tables and would fail one of them (PostgreSQL does not need this)."""
    import threading

    from django.core.handlers.wsgi import WSGIHandler

    gate = SimpleNamespace(lock=threading.Lock(), paths=[])  # paths: what the client asked for
    handle = WSGIHandler.__call__

    def serialized(self, environ, start_response):
        with gate.lock:
            gate.paths.append(environ["PATH_INFO"])
            return handle(self, environ, start_response)

    monkeypatch.setattr(WSGIHandler, "__call__", serialized)
    return gate


def test_create_wait_shows_progress_until_the_instance_is_ready(cli, catalog, customer, settings, one_at_a_time):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=50_000, now=timezone.now())
    login(cli, customer)
    ssh_key_add(customer=customer, name="k", public_key=KEY)
    proc = subprocess.Popen([sys.executable, "-m", "gpu_rent", "create", "--gpu", "3090", "--site", "DFW-1",
                             "--cycle", "week", "--wait", "--poll", "0.3", "--timeout", "60"],
                            env=_subprocess_env(cli), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() < started + 60:
        time.sleep(0.5)
        with one_at_a_time.lock:  # the client has seen it provisioning before the lifecycle runs
            if any(p.startswith("/api/v1/leases/") for p in one_at_a_time.paths):
                run_lifecycle(timezone.now())  # what beat does every minute
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lease = Lease.objects.get(customer=customer)
    assert "provisioning" in err and "ready" in err
    assert out.strip().endswith(f"ssh -p {lease.ssh_port} root@{lease.host}")


def test_wait_times_out_and_reports_a_failed_lease(cli, catalog, customer, settings):
    settings.HOST_AGENT_FAKE_DELAY = 10_000
    balance_top_up(customer=customer, amount_cents=50_000, now=timezone.now())
    login(cli, customer)
    ssh_key_add(customer=customer, name="k", public_key=KEY)
    code, out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--wait", "--timeout",
                         "1", "--poll", "0.2", "--json")
    assert code == errors.WAIT_TIMEOUT and json.loads(out)["error"] == "wait_timeout"
    lease = Lease.objects.get(customer=customer)
    run_lifecycle(timezone.now() + timedelta(hours=1))  # past the provisioning deadline: failed, refunded
    code, _out, err = cli("wait", str(lease.pk), "--timeout", "5", "--poll", "0.2")
    assert code == errors.LEASE_ENDED and f"Lease #{lease.pk} is wiped" in err  # failed, then wiped at once


def test_installs_alone_without_django(tmp_path, live_server, catalog):
    """A fresh venv, cli/requirements.lock (hashes checked) then `pip install --no-deps cli/`,
    as cli/README.md says (ADR 0024: the lock holds every dependency), the console script
    against the live server; Django is not importable there."""
    venv, source = tmp_path / "venv", tmp_path / "cli"
    shutil.copytree(CLI_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    for args in (["--require-hashes", "-r", str(source / "requirements.lock")], ["--no-deps", str(source)]):
        pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *args], capture_output=True,
                             text=True, timeout=300)
        assert pip.returncode == 0, pip.stderr
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import django"], capture_output=True,
                          timeout=60).returncode != 0
    # `cp`'s SSH library came with it, at the CLI's pin
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import paramiko; assert paramiko.__version__ == '5.0.0'"],
                          capture_output=True, timeout=60).returncode == 0
    done = subprocess.run([str(venv / "bin" / "gpu-rent"), "--url", live_server.url, "offers", "--json"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert {o["slug"] for o in json.loads(done.stdout)["offers"]} >= {"rtx-3090", "h100-sxm"}
    help_text = subprocess.run([str(venv / "bin" / "gpu-rent"), "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    assert "exit codes:" in help_text and "timed out waiting" in help_text
    # verify-record runs on the CLI's own dependencies (Ed25519 from cryptography), offline
    from nodeagent.signing import NodeKey, canonical_json

    key = NodeKey.generate(tmp_path / "node.pem")
    signed = canonical_json({"kind": "key_destroyed", "node": "n1", "lease_id": 1, "keyslots_after": 0,
                             "test_passphrase_exit": 2}).decode()
    (tmp_path / "record.json").write_text(json.dumps({"format": "gpu-storefront/sanitization-record/1", "lease_id": 1,
                                                      "proofs": [{"kind": "key_destroyed", "node": "n1",
                                                                  "public_key": key.public_key_b64(), "signed": signed,
                                                                  "signature": key.sign(signed.encode())}]}))
    checked = subprocess.run([str(venv / "bin" / "gpu-rent"), "verify-record", str(tmp_path / "record.json")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 20 and "NOT proven: who signed them" in checked.stdout, checked.stderr   # no wipe proof either
