"""End to end, the customer's workbench (docs/adr/0014, 0018; nodeagent/PROTOCOL.md): the
storefront (live server, fleet app, NodeAgentDriver) and one real `gpu-node-agent` process
on the suite's private dockerd, with a private registry of the test's own
(tests/nodeagent/registry.py --auth, in the node's network namespace) holding a static
busybox image (no sshd: reached through the node's sshd bundle).

1. The customer saves a registry credential on the account page, orders that private image
   with a variable, a secret, port 8080 open to one client address only and a start command
   serving HTTP on it, and pays: the agent pulls with the credential and starts the instance;
   the lease page and the API's workbench block show the port's public address (the node's
   report).
2. From the client namespace: ssh in and see the variable and the secret; the published port
   answers the allowed address with the start command's page and never another address.
3. A variable changed through the lease page's form: the node recreates the container, the
   disk's file stays, the new value is seen over ssh.
4. A second lease with a credential of a wrong password ends `registry_auth_failed`, said in
   plain words on the lease page and in the API, and that password is in no line the agent
   wrote and no stored report; the password corrected, the lease runs (a new pull at once)."""
import json
import re
import subprocess
import sys

import pytest
from django.urls import reverse
from django.utils import timezone

from tests import deadlines
from tests.tools import require_tool

from .agent_process import agent_cli, agent_env, start_agent, stop_agent, wait_for, write_config
from .conftest import ssh_run
from .outage_proxy import OutageProxy
from .registry_images import Registry, busybox_layer
from .storefront_side import container_started_at, lease_state, shared_db

pytestmark = pytest.mark.infra

TEMPLATE = "pytorch-2.5-cuda-12.4"
USER, PASSWORD, WRONG = "alice", "reg-pw-7f3a9c", "wrong-pw-51e0bd"
# The client namespace's extra addresses (TEST-NET-2): only ALLOWED is in port 8080's list.
ALLOWED, OTHER = "198.51.100.77", "198.51.100.78"
SERVE = ("mkdir -p /tmp/www && echo \"served $GREETING\" > /tmp/www/index.html && "
         "exec httpd -f -p 8080 -h /tmp/www")
# An HTTP GET from a chosen source address: prints the body, or exits 1 without an answer.
GET = ("import socket, sys\n"
       "source, host, port, seconds = sys.argv[1:]\n"
       "s = socket.socket()\n"
       "s.settimeout(float(seconds))\n"
       "s.bind((source, 0))\n"
       "try:\n"
       "    s.connect((host, int(port)))\n"
       "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
       "    data = b''\n"
       "    while chunk := s.recv(4096):\n"
       "        data += chunk\n"
       "    print(data.decode(errors='replace').split('\\r\\n\\r\\n', 1)[-1].strip())\n"
       "except OSError as exc:\n"
       "    sys.exit(f'{type(exc).__name__}: {exc}')\n")


@pytest.fixture
def storefront(live_server, settings, catalog):
    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    settings.NODE_POLL_SECONDS = 1
    proxy = OutageProxy(live_server.thread.host, live_server.thread.port)
    proxy.up()
    yield proxy
    proxy.down()


@pytest.fixture
def sources(netns):
    """ALLOWED and OTHER on the client namespace's loopback, routed there from the node."""
    steps = [["ip", "-n", netns.client, "addr", "add", f"{a}/32", "dev", "lo"] for a in (ALLOWED, OTHER)]
    steps += [["ip", "-n", netns.node, "route", "add", f"{a}/32", "via", netns.client_ip]
              for a in (ALLOWED, OTHER)]
    for argv in steps:
        subprocess.run(argv, check=True, capture_output=True)
    yield
    for argv in reversed(steps):
        subprocess.run([*argv[:4], "del", *argv[5:]], capture_output=True)


@pytest.fixture
def registry(netns, dockerd, tmp_path):
    made = Registry(netns, busybox_layer(tmp_path / "busybox.tar"), tmp_path / "registry.gate",
                    "team/workbench", auth=f"{USER}:{PASSWORD}")
    yield made
    made.stop()
    try:
        dockerd.client().images.remove(made.ref(), force=True)
    except Exception:
        pass


def remove_instances(dockerd) -> None:
    """The leases' containers and networks: the next test's leases have the same ids."""
    client = dockerd.client()
    for container in client.containers.list(all=True, filters={"name": "lease-"}):
        container.remove(force=True)
    for network in client.networks.list(names=["lease-"]):
        if network.name.startswith("lease-"):
            network.remove()


def http_get(netns, source: str, address: str) -> str:
    """The page `address` ("host:port") serves to a client at `source` ("" for no answer)."""
    host, port = address.rsplit(":", 1)
    done = subprocess.run(netns.in_client(sys.executable, "-c", GET, source, host, port,
                                          f"{deadlines.scaled(3):.1f}"),
                          capture_output=True, text=True, timeout=deadlines.scaled(30))
    return done.stdout.strip() if done.returncode == 0 else ""


def page(client, lease_id) -> str:
    response = shared_db(client.get, reverse("lease_detail", args=[lease_id]))
    assert response.status_code == 200
    return response.content.decode()


def api_workbench(client, token, lease_id) -> dict:
    response = shared_db(client.get, f"/api/v1/leases/{lease_id}/workbench",
                         HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    return response.json()


def test_own_image_credential_variables_secret_port_change_and_refused_credential(
        storefront, customer, operator, client, dockerd, instance_image, netns, sources, registry,
        nvml_stub, ssh_key, tmp_path):
    require_tool("ssh", "openssh-client")
    from billing.services import checkout_place_order, invoice_settle_manually
    from fleet.models import InstanceReport
    from fleet.services import enrolment_code_create
    from inventory.models import Offer, Site, SlotAllocation
    from rental.accounts.services import api_token_create
    from rental.models import Image, LeaseState, RegistryCredential
    from rental.workbench import registry_credential_save, workbench_for_order

    key_path, public_key = ssh_key
    client.force_login(customer)
    token = shared_db(api_token_create, customer=customer, name="e2e", scopes=["read", "manage"])[1]
    server = f"127.0.0.1:{registry.port}"

    # 1. The credential through the account page; the order with the customer's own image.
    saved = shared_db(client.post, reverse("registry_credential_create"),
                      {"name": "team", "server": server, "username": USER, "password": PASSWORD})
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    credential = shared_db(RegistryCredential.objects.get, customer=customer, name="team")
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    image = Image.objects.get(slug=TEMPLATE)

    def order(ref, cred, **fields):
        workbench = shared_db(workbench_for_order, customer=customer, image=image, image_ref=ref,
                              registry_credential=cred, **fields)
        return shared_db(checkout_place_order, customer=customer, offer=offer, site=site, term="week",
                         image=image, ssh_public_key=public_key, pay_from_balance=False,
                         now=timezone.now(), workbench=workbench)

    lease, invoice = order(registry.ref(), credential.pk, start_command=SERVE,
                           env={"GREETING": "hello"}, secrets={"API_TOKEN": "tok-e2e-1234"},
                           ports=[{"port": 8080, "allow": [f"{ALLOWED}/32"]}])
    node = SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).first().slot.node

    state = tmp_path / "agent-state"
    config = write_config(tmp_path / "config.toml", state_dir=state, dockerd=dockerd,
                          image_ref=instance_image, public_host=netns.node_ip,
                          gpu_count=node.gpu_count, image_slugs=(TEMPLATE,),
                          port_range=(22700, 22799))
    text = config.read_text().replace("[docker]\n", (
        "[docker]\n"
        "published_port_range = [23700, 23799]\n"
        f"ssh_bundle_dir = \"{tmp_path / 'ssh-bundle'}\"\n"))
    config.write_text(text)
    env = agent_env(nvml_stub, gpu_count=node.gpu_count)
    code = shared_db(enrolment_code_create, node=node, actor=operator, now=timezone.now())
    enrolled = agent_cli(config, "enrol", "--url", storefront.url, "--code", code, env=env)
    assert enrolled.returncode == 0, enrolled.stderr
    log = tmp_path / "agent.log"
    agent = start_agent(config, env, log)
    try:
        assert shared_db(invoice_settle_manually, invoice=invoice, actor=operator, note="bank transfer")
        wait_for(lambda: lease_state(lease.pk).state == LeaseState.ACTIVE, timeout=180,
                 what="lease active with the private image", log_path=log)
        shared_db(lease.refresh_from_db)
        assert lease.host == netns.node_ip
        # The node's report of the published port reaches the lease page and the API.
        wait_for(lambda: api_workbench(client, token, lease.pk)["addresses"].get("8080"), timeout=60,
                 what="port 8080's address reported", log_path=log)
        block = api_workbench(client, token, lease.pk)
        address = block["addresses"]["8080"]
        assert address.startswith(f"{netns.node_ip}:") and block["error"] is None
        assert block["image_ref"] == registry.ref() and block["registry_credential"] == "team"
        assert block["secret_names"] == ["API_TOKEN"] and "tok-e2e-1234" not in json.dumps(block)
        html = page(client, lease.pk)
        shown = re.search(r'id="workbench-port-8080".*?class="port-address">([^<]+)<', html, re.S)
        assert shown and shown.group(1) == address, html[html.find('id="workbench"'):][:3000]
        assert "tok-e2e-1234" not in html
        line = re.search(r'id="ssh-line"[^>]*value="ssh -p (\d+) root@([^"]+)"', html)
        assert line and line.group(2) == netns.node_ip, html[:3000]
        ssh_port = int(line.group(1))

        # 2. ssh in (the page's line): the variable and the secret; the port answers the
        # allowed address only, the start command's page.
        login = ssh_run(netns, key_path, ssh_port,
                        'echo "$GREETING/$API_TOKEN"; echo kept > /workspace/notes.txt')
        assert login.returncode == 0, login.stderr
        assert login.stdout.splitlines()[0] == "hello/tok-e2e-1234", login.stdout
        assert deadlines.wait_for(lambda: http_get(netns, ALLOWED, address) == "served hello",
                                  60, "the start command's page from the allowed address")
        assert http_get(netns, OTHER, address) == ""
        assert http_get(netns, netns.client_ip, address) == ""

        # 3. A variable changed on the lease page: a new container, the disk kept.
        started = container_started_at(dockerd, lease.pk)
        form = {"env": "GREETING=changed", "secrets": "", "ports": f"8080:{ALLOWED}/32",
                "start_command": SERVE}
        changed = shared_db(client.post, reverse("lease_workbench", args=[lease.pk]), form)
        assert changed.status_code == 302
        shared_db(lease.refresh_from_db)
        assert lease.env == {"GREETING": "changed"}, page(client, lease.pk)[-3000:]
        wait_for(lambda: container_started_at(dockerd, lease.pk) not in (started, None), timeout=120,
                 what="container recreated with the new variable", log_path=log)
        again = ssh_run(netns, key_path, ssh_port,
                        'echo "$GREETING/$API_TOKEN"; cat /workspace/notes.txt')
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[:2] == ["changed/tok-e2e-1234", "kept"], again.stdout
        address = api_workbench(client, token, lease.pk)["addresses"]["8080"]
        assert deadlines.wait_for(lambda: http_get(netns, ALLOWED, address) == "served changed",
                                  60, "the recreated instance's page")
        assert http_get(netns, OTHER, address) == ""

        # 4. A credential with a wrong password: the second lease fails, said in plain words.
        wrong = shared_db(registry_credential_save, customer=customer, name="wrong", server=server,
                          username=USER, password=WRONG, now=timezone.now())
        second, second_invoice = order(registry.ref(), wrong.pk, start_command="exec sleep 1000")
        assert shared_db(SlotAllocation.objects.filter(lease_id=second.pk).first).slot.node == node
        assert shared_db(invoice_settle_manually, invoice=second_invoice, actor=operator, note="paid")
        failed = wait_for(lambda: (api_workbench(client, token, second.pk)["error"] or {}).get("code")
                          not in (None, "image_pulling"), timeout=120,
                          what="the second lease's pull refused", log_path=log)
        assert failed and api_workbench(client, token, second.pk)["error"]["code"] == "registry_auth_failed"
        error = api_workbench(client, token, second.pk)["error"]
        assert "registry refused the credential" in error["text"]
        assert "registry refused the credential" in page(client, second.pk)
        assert shared_db(InstanceReport.objects.filter(lease_id=second.pk).exists)
        # The password corrected in the account: a new pull at once (no back-off), it runs.
        shared_db(registry_credential_save, customer=customer, name="wrong", server=server,
                  username=USER, password=PASSWORD, now=timezone.now())
        wait_for(lambda: lease_state(second.pk).state == LeaseState.ACTIVE, timeout=60,
                 what="the second lease running with the corrected credential", log_path=log)
        assert api_workbench(client, token, second.pk)["error"] is None
    finally:
        assert stop_agent(agent) == 0
        remove_instances(dockerd)
    written = log.read_text()
    assert "registry_auth_failed" in written          # the agent did log the refusal …
    for secret in (WRONG, PASSWORD):
        assert secret not in written                  # … without the password
        reports = shared_db(lambda: [json.dumps(r, default=str) for r in InstanceReport.objects.values()])
        assert reports and not [r for r in reports if secret in r]
