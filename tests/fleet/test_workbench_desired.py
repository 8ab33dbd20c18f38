"""The workbench between storefront and node (nodeagent/PROTOCOL.md): the desired state gives
the customer's image, registry login, start command, variables with the unsealed secrets and
ports to the node that runs the lease, and to no other node; the node's report of published
ports and pull progress is stored, shown on the lease page, and refused when malformed."""
import json
import logging

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.services import balance_top_up, checkout_place_order, price_lines
from fleet.models import InstanceReport
from inventory.models import Node, Offer, Site
from rental.models import Image, LeaseEvent
from rental.workbench import lease_workbench_change, registry_credential_save, workbench_for_order

from .conftest import KEY, node_of, provision_then_release, ready

pytestmark = pytest.mark.django_db

SECRET = "hf_s3cr3t-value-9f1c2b"
PASSWORD = "ghp_registry-password-77aa"


def order_with_workbench(customer, offer="rtx-3090", **workbench):
    """A lease paid from the balance, ordered with a workbench (rental.workbench)."""
    offer = Offer.objects.get(slug=offer)
    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=sum(
        line.amount_cents for line in price_lines(offer=offer, term="week", addons={})), now=now)
    image = Image.objects.get(slug=workbench.pop("template", "pytorch-2.5-cuda-12.4"))
    spec = workbench_for_order(customer=customer, image=image, **workbench)
    lease, _ = checkout_place_order(customer=customer, offer=offer, site=Site.objects.get(code="DFW-1"), term="week",
                                    image=image, ssh_public_key=KEY, pay_from_balance=True, now=now, workbench=spec)
    lease.refresh_from_db()
    return lease


@pytest.fixture
def private_lease(customer, catalog, node_agent_driver):
    credential = registry_credential_save(customer=customer, name="work", server="ghcr.io", username="alice",
                                          password=PASSWORD, now=timezone.now())
    return order_with_workbench(customer, image_ref="ghcr.io/alice/trainer:1.2", registry_credential=credential,
                                start_command="python serve.py", env={"MODE": "train"},
                                secrets={"HF_TOKEN": SECRET},
                                ports=[{"port": 8080, "allow": ["203.0.113.0/24", "2001:db8::/32"]}])


def item_of(document, lease):
    return next(i for i in document["instances"] if i["lease_id"] == lease.pk)


def test_the_node_running_the_lease_gets_its_image_login_command_variables_secrets_and_ports(
        private_lease, enrol, settings):
    node = enrol(node_of(private_lease))
    item = item_of(node.desired().json(), private_lease)
    assert item["image"] == "pytorch-2.5-cuda-12.4"
    assert item["image_ref"] == "ghcr.io/alice/trainer:1.2"
    assert item["registry_auth"] == {"server": "ghcr.io", "username": "alice", "password": PASSWORD}
    assert item["image_max_bytes"] == settings.WORKBENCH_IMAGE_MAX_GB * 10**9
    assert item["start_command"] == "python serve.py"
    assert item["env"] == {"MODE": "train", "HF_TOKEN": SECRET}
    assert item["ports"] == [{"port": 8080, "allow": ["203.0.113.0/24", "2001:db8::/32"]}]


def test_no_other_node_learns_the_secrets_or_the_registry_password(private_lease, enrol):
    """Every other enrolled node's whole desired document is free of both."""
    enrol(node_of(private_lease))
    others = Node.objects.exclude(pk=node_of(private_lease).pk)[:3]
    assert others
    for other in others:
        text = enrol(other).desired().content.decode()
        assert SECRET not in text and PASSWORD not in text


def test_the_jupyter_template_reaches_its_node_ready_to_run(customer, catalog, node_agent_driver, enrol):
    """The template's image, its start command with the lease's own token, and port 8888."""
    lease = order_with_workbench(customer, template="jupyter-pytorch-cuda")
    item = item_of(enrol(node_of(lease)).desired().json(), lease)
    assert item["image"] == "jupyter-pytorch-cuda"
    assert item["image_ref"] == "quay.io/jupyter/pytorch-notebook:cuda12-latest" and "registry_auth" not in item
    assert item["start_command"].startswith("exec jupyter lab") and '"$JUPYTER_TOKEN"' in item["start_command"]
    assert set(item["env"]) == {"JUPYTER_TOKEN"} and len(item["env"]["JUPYTER_TOKEN"]) >= 32
    assert item["ports"] == [{"port": 8888, "allow": ["0.0.0.0/0", "::/0"]}]


def test_a_lease_without_a_workbench_reads_as_before(paid_lease, enrol):
    """No new field at all: an agent that predates them sees the same item."""
    lease = paid_lease()
    item = item_of(enrol(node_of(lease)).desired().json(), lease)
    assert not {"image_ref", "registry_auth", "image_max_bytes", "start_command", "env", "ports"} & set(item)


def test_once_the_lease_ended_its_node_is_told_nothing_secret(private_lease, enrol):
    """Released: the item asks the node to remove the instance, without the login or secrets."""
    node = enrol(node_of(private_lease))
    provision_then_release(node, private_lease)
    item = item_of(node.desired().json(), private_lease)
    assert item["want"] == "absent"
    assert "env" not in item and "registry_auth" not in item
    assert SECRET not in json.dumps(item)


def test_after_a_move_only_the_new_node_is_told_the_secrets(private_lease, enrol):
    """The node the lease moved off keeps a copy of its disk to destroy: it is told to remove
    the instance, and nothing of the login or the secrets; the new node gets them."""
    from rental.failover import lease_migrate

    source = enrol(node_of(private_lease))
    source.report(evidence=[ready(source, private_lease)])
    lease_migrate(lease_id=private_lease.pk, from_node=source.node, now=timezone.now(), reason="test")
    target = enrol(node_of(private_lease))
    assert target.node != source.node
    old = item_of(source.desired().json(), private_lease)
    assert old["want"] == "absent" and "env" not in old and "registry_auth" not in old
    assert SECRET not in source.desired().content.decode() and PASSWORD not in source.desired().content.decode()
    new = item_of(target.desired().json(), private_lease)
    assert new["env"]["HF_TOKEN"] == SECRET and new["registry_auth"]["password"] == PASSWORD


def test_a_change_reaches_the_node_at_once_and_its_audit_row_names_names_only(private_lease, enrol, customer):
    node = enrol(node_of(private_lease))
    etag = node.desired()["ETag"]
    lease_workbench_change(lease_id=private_lease.pk, customer=customer, now=timezone.now(),
                           secrets={"WANDB_API_KEY": "wandb-secret-123"}, env={"MODE": None},
                           ports=[{"port": 6006}])
    response = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth)
    assert response.status_code == 200       # the version moved: not a 304
    item = item_of(response.json(), private_lease)
    assert item["env"] == {"HF_TOKEN": SECRET, "WANDB_API_KEY": "wandb-secret-123"}
    assert item["ports"] == [{"port": 6006, "allow": ["0.0.0.0/0", "::/0"]}]
    event = LeaseEvent.objects.get(lease=private_lease, kind="workbench_changed")
    assert event.data["changed"] == ["env", "secrets", "ports"]
    assert event.data["secret_names"] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert "wandb-secret-123" not in json.dumps(event.data) and SECRET not in json.dumps(event.data)


def test_changing_the_registry_password_reaches_the_node(private_lease, enrol, customer):
    node = enrol(node_of(private_lease))
    etag = node.desired()["ETag"]
    registry_credential_save(customer=customer, name="work", server="ghcr.io", username="alice",
                             password="rotated-token", now=timezone.now())
    response = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth)
    assert response.status_code == 200
    assert item_of(response.json(), private_lease)["registry_auth"]["password"] == "rotated-token"


# --- reports: published ports and pull progress ---------------------------------------------------

def instance(lease, **fields):
    return {"lease_id": lease.pk, "state": "running", "ssh_port": 22042, "egress_bytes": 0, **fields}


def test_reported_ports_and_pull_are_stored_and_the_lease_page_shows_them(private_lease, enrol, client, customer):
    node = enrol(node_of(private_lease))
    node.report(evidence=[ready(node, private_lease)])
    answer = node.report(instances=[instance(private_lease, pull={"done_bytes": 500_000_000,
                                                                  "total_bytes": 2_000_000_000},
                                             error={"code": "image_pulling", "detail": "pulling"})]).json()
    assert answer["accepted"] == ["instances[0]"]
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[private_lease.pk])).content.decode()
    assert 'value="25"' in page and "Pulling the image" in page
    assert node.report(instances=[instance(private_lease, ports={"8080": 31002})]).json()["accepted"] == \
        ["instances[0]"]
    report = InstanceReport.objects.get(lease=private_lease)
    assert (report.ports, report.pull) == ({"8080": 31002}, None)
    page = client.get(reverse("lease_detail", args=[private_lease.pk])).content.decode()
    assert "203.0.113.7:31002" in page and "only from" in page and "203.0.113.0/24" in page
    assert SECRET not in page and PASSWORD not in page


@pytest.mark.parametrize("code, words", [
    ("image_not_found", "The registry has no such image"),
    ("image_too_large", "larger than the 64 GB allowed"),
    ("image_no_shell", "has no /bin/sh"),
    ("registry_auth_failed", "The registry refused the credential"),
])
def test_a_pull_failure_is_said_in_plain_words(private_lease, enrol, client, customer, code, words):
    node = enrol(node_of(private_lease))
    node.report(instances=[instance(private_lease, state="failed", error={"code": code, "detail": "x"})])
    client.force_login(customer)
    assert words in client.get(reverse("lease_detail", args=[private_lease.pk])).content.decode()


@pytest.mark.parametrize("ports, pull", [
    ({"8080": "31002"}, None), ({"http": 31002}, None), ({"8080": 0}, None), ({"70000": 1}, None),
    ([8080], None), ({"8080": True}, None), ({str(p): 30000 + p for p in range(1, 70)}, None),
    (None, {"done_bytes": -1, "total_bytes": 5}), (None, {"done_bytes": "1"}), (None, [1, 2]),
    (None, {"done_bytes": 2**63, "total_bytes": 1}),
])
def test_malformed_ports_or_pull_from_a_node_are_refused_not_a_500(private_lease, enrol, ports, pull):
    node = enrol(node_of(private_lease))
    fields = {k: v for k, v in (("ports", ports), ("pull", pull)) if v is not None}
    response = node.report(instances=[instance(private_lease, **fields)])
    assert response.status_code == 200
    assert response.json()["refused"] == [{"item": "instances[0]", "error": "invalid_ports" if ports else
                                           "invalid_pull"}]
    assert not InstanceReport.objects.filter(lease=private_lease).exists()


def test_a_steady_report_with_the_same_ports_writes_nothing_and_a_change_is_stored(private_lease, enrol):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    node = enrol(node_of(private_lease))
    node.report(instances=[instance(private_lease, ports={"8080": 31002})])
    node.desired()
    with CaptureQueriesContext(connection) as queries:
        node.post(node.body(instances=[instance(private_lease, ports={"8080": 31002})]))
    assert not [q for q in queries.captured_queries if "fleet_instancereport" in q["sql"] and
                q["sql"].lstrip().upper().startswith("UPDATE")]
    node.report(instances=[instance(private_lease, ports={"8080": 31009})])
    assert InstanceReport.objects.get(lease=private_lease).ports == {"8080": 31009}


def test_no_log_line_or_sql_statement_carries_a_secret_or_the_registry_password(
        customer, catalog, node_agent_driver, enrol, caplog):
    """Ordering, the node's polls and reports, and a change, with every logger at DEBUG and
    every SQL statement logged: the values are sealed before they reach the database, and
    nothing logs them on the way to the node."""
    from django.db import connection

    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django")      # Django's own loggers stop at INFO otherwise
    connection.force_debug_cursor = True        # django.db.backends logs every statement with its values
    try:
        credential = registry_credential_save(customer=customer, name="work", server="ghcr.io", username="alice",
                                              password=PASSWORD, now=timezone.now())
        lease = order_with_workbench(customer, image_ref="ghcr.io/alice/trainer:1.2",
                                     registry_credential=credential, secrets={"HF_TOKEN": SECRET})
        node = enrol(node_of(lease))
        node.report(evidence=[ready(node, lease)], instances=[instance(lease, ports={})])
        lease_workbench_change(lease_id=lease.pk, customer=customer, now=timezone.now(),
                               secrets={"OTHER": "another-secret-5566"})
        assert SECRET in node.desired().content.decode()     # it did travel, to this node
    finally:
        connection.force_debug_cursor = False
    logged = "\n".join(r.getMessage() + " " + str(r.args) for r in caplog.records)
    assert "fleet_instancereport" in logged                   # the statements were logged
    assert SECRET not in logged and PASSWORD not in logged and "another-secret-5566" not in logged
