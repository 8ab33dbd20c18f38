"""What people see: the customer's lease page (connection line, the state the node
reported and its age, restart / stop / start through the desired state, never another
customer's lease), the admin's node health and one-time enrolment codes, the FakeAgent
banner, the ops dashboard, and the operators' command."""
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from fleet.crypto import secret_hash
from fleet.models import EnrolmentCode, NodeAgent
from inventory.models import Node
from rental.models import Lease
from tests.otp import (
    TwoFactorClient as Client,  # staff pass the code step like force_login passes the password
)

from .conftest import FakeNode, node_of, ready

pytestmark = pytest.mark.django_db


@pytest.fixture
def active(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(instances=[{"lease_id": lease.pk, "op_id": f"{lease.pk}:running:1", "state": "running",
                            "ssh_port": 22042, "egress_bytes": 0, "error": None}],
                evidence=[ready(node, lease, port=22042)])
    lease.refresh_from_db()
    return lease, node


def page(client, lease) -> str:
    response = client.get(reverse("lease_detail", args=[lease.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_lease_page_shows_connection_and_reported_state(active, customer):
    lease, _ = active
    client = Client()
    client.force_login(customer)
    html = page(client, lease)
    assert "ssh -p 22042 root@203.0.113.7" in html
    assert 'id="instance-state"' in html and "running" in html and "ago" in html
    assert f'action="/leases/{lease.pk}/instance/restart/"' in html


def test_the_instance_on_its_node_is_read_in_one_query(active, paid_lease, customer):
    """The node holding the lease, its report of the instance and whether the customer stopped
    it come from one query; a lease whose node has not reported it yet still shows the node (a
    second query, provisioning)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.templatetags.fleet_tags import instance_view, node_and_report

    lease, node = active
    with CaptureQueriesContext(connection) as queries:
        node_id, report = node_and_report(lease)
        view = instance_view(lease)
    assert len(queries) == 1
    assert node_id == node_of(lease).pk and (report.state, report.ssh_port) == ("running", 22042)
    assert view.report == report and not view.stopped_by_customer
    client = Client()
    client.force_login(customer)
    client.post(reverse("instance_action", args=[lease.pk, "stop"]))
    assert instance_view(Lease.objects.get(pk=lease.pk)).stopped_by_customer
    waiting = paid_lease()
    assert node_and_report(waiting) == (node_of(waiting).pk, None)
    assert instance_view(waiting).report is None and not instance_view(waiting).stopped_by_customer


def test_restart_stop_start_change_the_desired_state(active, customer):
    lease, node = active
    client = Client()
    client.force_login(customer)
    first = node.desired().json()["instances"][0]
    assert client.post(reverse("instance_action", args=[lease.pk, "restart"])).status_code == 302
    restarted = node.desired().json()["instances"][0]
    assert restarted["want"] == "running" and restarted["op_id"] != first["op_id"]
    client.post(reverse("instance_action", args=[lease.pk, "stop"]))
    stopped = node.desired().json()["instances"][0]
    assert stopped["want"] == "stopped"
    html = page(client, lease)
    assert "Stopped by you" in html and "/instance/start/" in html and "/instance/restart/" not in html
    # Restart while stopped is refused with a message, and changes nothing.
    response = client.post(reverse("instance_action", args=[lease.pk, "restart"]), follow=True)
    assert "start it instead" in response.content.decode()
    assert node.desired().json()["instances"][0]["op_id"] == stopped["op_id"]
    client.post(reverse("instance_action", args=[lease.pk, "start"]))
    started = node.desired().json()["instances"][0]
    assert started["want"] == "running"
    assert len({first["op_id"], restarted["op_id"], stopped["op_id"], started["op_id"]}) == 4
    kinds = list(lease.events.filter(kind__startswith="instance_").values_list("kind", "actor__username"))
    assert kinds == [("instance_restart", "alice"), ("instance_stop", "alice"), ("instance_start", "alice")]


def test_another_customer_cannot_act_on_the_instance(active, other_customer):
    lease, node = active
    client = Client()
    client.force_login(other_customer)
    assert client.get(reverse("lease_detail", args=[lease.pk])).status_code == 404
    assert client.post(reverse("instance_action", args=[lease.pk, "stop"])).status_code == 404
    assert client.post(reverse("instance_action", args=[lease.pk, "nonsense"])).status_code == 404
    assert node.desired().json()["instances"][0]["want"] == "running"
    assert Client().post(reverse("instance_action", args=[lease.pk, "stop"])).status_code == 302  # to login


def test_admin_enrolment_code_is_shown_once_and_works(catalog, operator):
    node = Node.objects.order_by("pk").first()
    client = Client()
    client.force_login(operator)
    response = client.post(reverse("admin:inventory_node_changelist"),
                           {"action": "enrolment_code", "_selected_action": [node.pk]})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    html = response.content.decode()
    code = html.split('<code class="enrolment-code">')[1].split("</code>")[0]
    assert EnrolmentCode.objects.get(node=node).code_hash == secret_hash(code)
    assert "gpu-node-agent enrol --url http://testserver --code " + code in html
    assert FakeNode(node, Client()).enrol(code).status_code == 200


def test_admin_lease_page_shows_reports_and_evidence(active, operator):
    lease, node = active
    client = Client()
    client.force_login(operator)
    html = client.get(reverse("admin:rental_lease_change", args=[lease.pk])).content.decode()
    assert "Instance as reported by the nodes" in html and "Signed evidence from the nodes" in html
    assert f"{lease.pk}:running:1" in html and "instance ready" in html


def test_admin_node_health_and_not_reporting_alert(active, operator, settings):
    lease, node = active
    client = Client()
    client.force_login(operator)
    html = client.get(reverse("admin:inventory_node_changelist")).content.decode()
    assert "0.1.0" in html and "0 / 8" in html  # its reports listed no GPUs yet
    assert "not reporting" not in html
    NodeAgent.objects.filter(node=node.node).update(
        last_report_at=timezone.now() - settings.NODE_REPORT_STALE_AFTER - timedelta(minutes=1))
    html = client.get(reverse("admin:inventory_node_changelist")).content.decode()
    assert "not reporting" in html
    board = client.get(reverse("admin:ops_dashboard")).content.decode()
    assert f"Node {node.node.name} is not reporting" in board and 'id="node-health"' in board


def test_fake_agent_banner_only_while_fake_agent_is_active(catalog, operator, settings):
    client = Client()
    client.force_login(operator)
    settings.HOST_AGENT = "rental.agent.FakeAgent"
    assert 'id="fake-agent-banner"' in client.get(reverse("admin:index")).content.decode()
    assert 'id="fake-agent-alert"' in client.get(reverse("admin:ops_dashboard")).content.decode()
    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    assert 'id="fake-agent-banner"' not in client.get(reverse("admin:index")).content.decode()
    assert 'id="fake-agent-alert"' not in client.get(reverse("admin:ops_dashboard")).content.decode()


def test_customer_page_says_demo_when_fake_agent(paid_lease, customer, settings):
    lease = paid_lease()
    settings.HOST_AGENT = "rental.agent.FakeAgent"
    client = Client()
    client.force_login(customer)
    assert "Demo store: no real server runs this instance." in page(client, lease)
    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    assert "No report from the server yet." in page(client, lease)


def test_production_default_is_the_node_agent():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TESTING", "DEBUG", "HOST_AGENT")}
    env.update(DJANGO_SETTINGS_MODULE="storefront.settings", SECRET_KEY="x" * 50, ALLOWED_HOSTS="shop.example",
               DATABASE_URL="postgres://shop@127.0.0.1:5432/shop")  # production refuses to start without them
    code = "import django; django.setup(); from django.conf import settings; print(settings.HOST_AGENT)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "fleet.driver.NodeAgentDriver"
    env["DEBUG"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "rental.agent.FakeAgent"


def test_node_enrolment_code_command(catalog):
    node = Node.objects.order_by("pk").first()
    out, err = StringIO(), StringIO()
    call_command("node_enrolment_code", node.name, "--url", "https://shop.example", stdout=out, stderr=err)
    code = out.getvalue().strip()
    assert EnrolmentCode.objects.get(node=node).code_hash == secret_hash(code)
    assert f"gpu-node-agent enrol --url https://shop.example --code {code}" in err.getvalue()
    with pytest.raises(Exception, match="No node named"):
        call_command("node_enrolment_code", "no-such-node")
