"""Enrolment and mutual authentication (PROTOCOL.md, "Trust"): one-time, expiring,
hashed codes; credentials stored hashed; a node sees and reports only its own leases;
forged, replayed and stale reports are refused and change nothing."""
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.crypto import secret_hash
from fleet.models import EnrolmentCode, InstanceReport, NodeAgent
from fleet.services import enrolment_code_create
from inventory.models import AuditEntry, Node
from rental.models import LeaseState

from .conftest import FakeNode, node_of, ready

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(catalog):
    return Node.objects.filter(gpu_model__slug="rtx-3090").order_by("pk").first()


def test_enrolment_code_is_one_time_and_hashed(node, operator):
    code = enrolment_code_create(node=node, actor=operator, now=timezone.now())
    row = EnrolmentCode.objects.get(node=node)
    assert row.code_hash == secret_hash(code) and code not in row.code_hash
    first = FakeNode(node, Client())
    response = first.enrol(code)
    assert response.status_code == 200
    assert response.json()["node"] == node.name and response.json()["poll_seconds"] == 15
    agent = NodeAgent.objects.get(node=node)
    assert agent.credential_hash == secret_hash(first.credential) and first.credential not in agent.credential_hash
    assert agent.public_key == first.public_key and agent.hostname == node.name
    assert AuditEntry.objects.filter(action="node_enrolled", object_id=str(node.pk)).exists()
    # The same code a second time: refused, the first enrolment stands.
    second = FakeNode(node, Client())
    assert second.enrol(code).status_code == 403
    assert second.enrol(code).json() == {"error": "enrolment_refused"}
    assert NodeAgent.objects.get(node=node).public_key == first.public_key
    assert first.desired().status_code == 200


def test_expired_or_unknown_code_is_refused(node, operator, settings):
    code = enrolment_code_create(node=node, actor=operator, now=timezone.now() - settings.NODE_ENROLMENT_CODE_TTL
                                 - timedelta(seconds=1))
    assert FakeNode(node, Client()).enrol(code).status_code == 403
    assert FakeNode(node, Client()).enrol("not-a-code").status_code == 403
    assert not NodeAgent.objects.exists()


def test_a_new_code_replaces_credential_and_key(node, enrol, operator):
    old = enrol(node)
    new = FakeNode(node, Client())
    assert new.enrol(enrolment_code_create(node=node, actor=operator, now=timezone.now())).status_code == 200
    assert old.desired().status_code == 401
    assert new.desired().status_code == 200
    assert NodeAgent.objects.get(node=node).public_key == new.public_key


def test_a_bad_public_key_is_400(node, operator):
    code = enrolment_code_create(node=node, actor=operator, now=timezone.now())
    response = Client().post("/agent/v1/enrol", json.dumps({"code": code, "public_key": "AAAA"}),
                             content_type="application/json")
    assert response.status_code == 400
    assert not EnrolmentCode.objects.filter(used_at__isnull=False).exists()  # the code is still good


def test_unknown_credential_is_401():
    client = Client()
    assert client.get("/agent/v1/desired").status_code == 401
    assert client.get("/agent/v1/desired", HTTP_AUTHORIZATION="Node nope").status_code == 401
    assert client.post("/agent/v1/report", b"{}", content_type="application/json",
                       HTTP_AUTHORIZATION="Bearer x").status_code == 401


def test_node_sees_and_reports_only_its_own_leases(paid_lease, enrol):
    lease_a = paid_lease(offer="2x-a100-sxm")
    lease_b = paid_lease(offer="rtx-3090")
    node_a, node_b = enrol(node_of(lease_a)), enrol(node_of(lease_b))
    assert node_a.node != node_b.node
    assert [i["lease_id"] for i in node_a.desired().json()["instances"]] == [lease_a.pk]
    assert [i["lease_id"] for i in node_b.desired().json()["instances"]] == [lease_b.pk]
    # Node A reports on B's lease and sends evidence for it, correctly signed with A's key.
    response = node_a.report(instances=[{"lease_id": lease_b.pk, "op_id": "x", "state": "running",
                                         "ssh_port": 22001, "egress_bytes": 0, "error": None}],
                             evidence=[ready(node_a, lease_b)])
    assert response.status_code == 200
    assert response.json() == {"accepted": [], "refused": [{"item": "instances[0]", "error": "unknown_lease"},
                                                           {"item": "evidence[0]", "error": "unknown_lease"}]}
    assert not InstanceReport.objects.exists()
    lease_b.refresh_from_db()
    assert lease_b.state == LeaseState.PROVISIONING


def test_a_node_asking_for_another_nodes_desired_state_gets_its_own(paid_lease, enrol):
    lease_a = paid_lease(offer="2x-a100-sxm")
    lease_b = paid_lease(offer="rtx-3090")
    node_a, node_b = enrol(node_of(lease_a)), enrol(node_of(lease_b))
    for query in ({"node": node_a.node.name}, {"node": str(node_a.node.pk)}, {"node_id": node_a.node.pk}):
        response = node_b.client.get("/agent/v1/desired", query, **node_b.auth)
        assert response.status_code == 200
        document = response.json()
        assert document["node"] == node_b.node.name, query
        assert [i["lease_id"] for i in document["instances"]] == [lease_b.pk], query
    # Nor does A's ETag (what A holds) stand for B's state: B gets its own document, not a 304.
    a_holds, b_holds = node_a.desired()["ETag"], node_b.desired()["ETag"]
    assert a_holds != b_holds
    for query in ({"node": node_a.node.name}, {}):
        response = node_b.client.get("/agent/v1/desired", query, HTTP_IF_NONE_MATCH=a_holds, **node_b.auth)
        assert (response.status_code, response["ETag"]) == (200, b_holds), query
        assert [i["lease_id"] for i in response.json()["instances"]] == [lease_b.pk], query


def test_forged_signature_is_refused_and_changes_nothing(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    body = node.body(evidence=[ready(node, lease)])
    forger = FakeNode(node.node, Client())  # another key: the credential alone is not enough
    response = node.post(body, signature=forger.sign(body))
    assert response.status_code == 401 and response.json() == {"error": "bad_signature"}
    tampered = body.replace(b"203.0.113.7", b"198.51.100.9")
    assert node.post(tampered, signature=node.sign(body)).status_code == 401
    assert node.post(body, signature="").status_code == 401
    agent = NodeAgent.objects.get(node=node.node)
    assert agent.last_seq == 0 and agent.last_report_at is None
    lease.refresh_from_db()
    assert lease.state == LeaseState.PROVISIONING


def test_replayed_seq_is_refused(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    body = node.body(seq=5)
    assert node.post(body).status_code == 200
    replay = node.post(body)
    assert replay.status_code == 409 and replay.json() == {"error": "replayed"}
    assert node.post(node.body(seq=4)).status_code == 409
    assert node.post(node.body(seq=6)).status_code == 200
    assert node.post(node.body(seq=6)).status_code == 409     # wherever the guard keeps it (fleet/seq.py)
    assert node.post(node.body(seq=7)).status_code == 200


def test_stale_or_future_sent_at_is_refused(paid_lease, enrol, settings):
    lease = paid_lease()
    node = enrol(node_of(lease))
    skew = settings.NODE_REPORT_MAX_SKEW + timedelta(seconds=30)
    for sent_at in (timezone.now() - skew, timezone.now() + skew):
        response = node.post(node.body(sent_at=sent_at))
        assert response.status_code == 400 and response.json() == {"error": "stale"}
    assert NodeAgent.objects.get(node=node.node).last_seq == 0


def test_revoked_credential_is_401(paid_lease, enrol, operator):
    from fleet.services import node_credential_revoke

    lease = paid_lease()
    node = enrol(node_of(lease))
    assert node_credential_revoke(node=node.node, actor=operator, now=timezone.now())
    assert node.desired().status_code == 401
    assert node.post(node.body()).status_code == 401


def test_enrolment_codes_and_credentials_never_look_like_command_line_options():
    """The operator types the code after `gpu-node-agent enrol --code`; a leading '-' made
    argparse refuse it (seen in CI with urlsafe tokens)."""
    from fleet.crypto import new_secret

    secrets_made = {new_secret() for _ in range(2000)}
    assert len(secrets_made) == 2000 and not any(s.startswith("-") for s in secrets_made)
    assert all(len(s) == 64 and set(s) <= set("0123456789abcdef") for s in secrets_made)
