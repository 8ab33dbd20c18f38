"""The agent API over real HTTP (pytest-django's live server, urllib as the agent's
client): headers, raw-body signatures and JSON survive a real WSGI server, not only the
test client."""
import base64
import json
import urllib.error
import urllib.request

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.utils import timezone

from fleet.crypto import canonical_json
from fleet.services import enrolment_code_create
from rental.models import LeaseState

from .conftest import node_of, rfc3339

pytestmark = pytest.mark.django_db(transaction=True)


def call(url, *, data: bytes | None = None, headers=None):
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})},
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_enrol_poll_and_signed_report_over_http(live_server, paid_lease, operator):
    lease = paid_lease()
    node = node_of(lease)
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    code = enrolment_code_create(node=node, actor=operator, now=timezone.now())
    status, enrolled = call(f"{live_server.url}/agent/v1/enrol", data=json.dumps(
        {"code": code, "public_key": public, "agent_version": "0.1.0", "hostname": "gpu-07"}).encode())
    assert status == 200 and enrolled["node"] == node.name
    auth = {"Authorization": f"Node {enrolled['credential']}"}

    status, desired = call(f"{live_server.url}/agent/v1/desired", headers=auth)
    assert status == 200
    [wanted] = desired["instances"]
    assert wanted["lease_id"] == lease.pk and wanted["want"] == "running"

    record = {"kind": "instance_ready", "node": node.name, "lease_id": lease.pk, "op_id": wanted["op_id"],
              "at": rfc3339(timezone.now()), "ssh_port": 22042, "host": "203.0.113.7", "gpus": ["GPU-0"],
              "image": wanted["image"]}
    record["signature"] = base64.b64encode(key.sign(canonical_json(record))).decode()
    body = json.dumps({"seq": 1, "sent_at": rfc3339(timezone.now()), "agent_version": "0.1.0",
                       "public_host": "203.0.113.7", "gpu_library": "none", "gpus": [],
                       "instances": [{"lease_id": lease.pk, "op_id": wanted["op_id"], "state": "running",
                                      "ssh_port": 22042, "egress_bytes": 0, "error": None}],
                       "evidence": [record]}, ensure_ascii=False).encode()
    signed = {**auth, "X-Node-Signature": base64.b64encode(key.sign(body)).decode()}
    status, outcome = call(f"{live_server.url}/agent/v1/report", data=body, headers=signed)
    assert (status, outcome) == (200, {"accepted": ["instances[0]", "evidence[0]"], "refused": []})
    assert call(f"{live_server.url}/agent/v1/report", data=body, headers=signed) == (409, {"error": "replayed"})
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE and lease.ssh_command == "ssh -p 22042 root@203.0.113.7"
