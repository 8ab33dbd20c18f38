"""A node agent as the storefront sees it: a real Ed25519 key (cryptography), enrolment
through the API, reports signed over their raw bytes, evidence signed over its canonical
JSON — exactly as nodeagent/PROTOCOL.md says."""
import base64
import json
from datetime import UTC, datetime, timedelta
from itertools import count

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.test import Client
from django.utils import timezone

from fleet.crypto import canonical_json
from fleet.models import IssuedOp
from fleet.services import enrolment_code_create
from rental.models import Lease, LeaseState

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeNode:
    """The storefront-facing half of an agent: key pair, credential, seq counter."""

    def __init__(self, node, client: Client):
        self.node, self.client = node, client
        self.key = Ed25519PrivateKey.generate()
        self.public_key = base64.b64encode(
            self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        self.credential = ""
        self.seq = count(1)

    def enrol(self, code: str):
        response = self.client.post("/agent/v1/enrol", json.dumps(
            {"code": code, "public_key": self.public_key, "agent_version": "0.1.0", "hostname": self.node.name}),
            content_type="application/json")
        if response.status_code == 200:
            self.credential = response.json()["credential"]
        return response

    @property
    def auth(self) -> dict:
        return {"HTTP_AUTHORIZATION": f"Node {self.credential}"}

    def desired(self):
        return self.client.get("/agent/v1/desired", **self.auth)

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.key.sign(data)).decode()

    def issued_op(self, lease) -> str:
        """The op the storefront issued this node for `lease` (polled first, as an agent
        does before acting); evidence counts only for it."""
        self.desired()
        return IssuedOp.objects.filter(lease=lease, node=self.node).values_list("op_id", flat=True).first() or ""

    def evidence(self, kind: str, lease, op_id: str = "", **fields) -> dict:
        record = {"kind": kind, "node": self.node.name, "lease_id": lease.pk,
                  "op_id": op_id or self.issued_op(lease) or f"{lease.pk}:never-issued:1",
                  "at": rfc3339(timezone.now()), **fields}
        return {**record, "signature": self.sign(canonical_json(record))}

    def body(self, *, seq=None, sent_at=None, **items) -> bytes:
        report = {"seq": next(self.seq) if seq is None else seq, "sent_at": rfc3339(sent_at or timezone.now()),
                  "agent_version": "0.1.0", "public_host": "203.0.113.7", "gpu_library": "nvml", **items}
        return json.dumps(report).encode()

    def post(self, body: bytes, signature: str | None = None):
        return self.client.post("/agent/v1/report", body, content_type="application/json",
                                HTTP_X_NODE_SIGNATURE=self.sign(body) if signature is None else signature,
                                **self.auth)

    def report(self, **items):
        """One agent loop turn: fetch the desired state, then report (signed)."""
        assert self.desired().status_code == 200
        return self.post(self.body(**items))


def ready(node: FakeNode, lease, port=22042, op_id=""):
    return node.evidence("instance_ready", lease, op_id, ssh_port=port, host="203.0.113.7",
                         gpus=["GPU-0"], image="pytorch")


def provision_then_release(node: FakeNode, lease) -> None:
    """The lease's instance reported ready on `node`, then the term run out unpaid: suspended
    at its end and released when the hold ends."""
    from rental.services import lease_release, lease_suspend

    node.report(evidence=[ready(node, lease)])
    lease.refresh_from_db()
    lease_suspend(lease_id=lease.pk, now=lease.ends_at)
    lease.refresh_from_db()
    lease_release(lease_id=lease.pk, now=lease.hold_until)


def key_destroyed(node: FakeNode, lease, op_id="", keyslots_after=0, test_exit=2):
    return node.evidence("key_destroyed", lease, op_id, device="/dev/vg/lease", luks_uuid="u-1",
                         commands=[{"argv": ["cryptsetup", "erase", "/dev/vg/lease"], "exit": 0}],
                         test_passphrase_exit=test_exit, keyslots_after=keyslots_after)


def disk_wiped(node: FakeNode, lease, op_id="", result="ok", verification=None):
    return node.evidence("disk_wiped", lease, op_id, device_model="TEST NVMe", device_serial="S1", firmware="1",
                         method="discard+overwrite", nist_category="clear",
                         commands=[{"argv": ["blkdiscard", "/dev/vg/lease"], "exit": 0 if result == "ok" else 1}],
                         verification=verification or {"samples": 64, "nonzero": 0, "pattern": "zero"},
                         started_at=rfc3339(timezone.now()), finished_at=rfc3339(timezone.now()), result=result)


@pytest.fixture
def node_agent_driver(settings):
    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"


@pytest.fixture
def enrol(db, operator):
    """enrol(node) -> an enrolled FakeNode for that inventory.Node."""

    def _enrol(node):
        fake = FakeNode(node, Client())
        response = fake.enrol(enrolment_code_create(node=node, actor=operator, now=timezone.now()))
        assert response.status_code == 200, response.content
        return fake

    return _enrol


@pytest.fixture
def paid_lease(catalog, customer, node_agent_driver):
    """paid_lease(offer=...) -> a lease paid from the balance now: provisioning on a node."""
    from billing.services import balance_top_up, checkout_place_order, price_lines
    from inventory.models import Offer, Site
    from rental.models import Image

    def _paid(offer="rtx-3090", term="week", who=None, addons=None):
        who = who or customer
        offer = Offer.objects.get(slug=offer)
        addons = addons or {}
        now = timezone.now()
        balance_top_up(customer=who, amount_cents=sum(
            line.amount_cents for line in price_lines(offer=offer, term=term, addons=addons)), now=now)
        lease, _ = checkout_place_order(customer=who, offer=offer, site=Site.objects.get(code="DFW-1"), term=term,
                                        image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                        addons=addons, pay_from_balance=True, now=now)
        lease.refresh_from_db()
        return lease

    return _paid


def node_of(lease):
    from inventory.models import SlotAllocation

    return (SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True)
            .select_related("slot__node").first().slot.node)


def later(minutes: float) -> datetime:
    return timezone.now() + timedelta(minutes=minutes)


def leaseless_agent(url: str, operator, state_root, *, poll_seconds: int = 15):
    """The shipped agent's loop (nodeagent.agent.Agent) enrolled over HTTP at `url` for a node
    without leases, with no Docker and no disks (tests/nodeagent/no_instances.py): for tests
    that drive its rounds and waits against the live server. Returns (agent, node)."""
    from fleet.services import enrolment_code_create
    from inventory.models import Node
    from nodeagent.agent import Agent
    from nodeagent.client import StorefrontClient
    from nodeagent.config import AgentConfig
    from nodeagent.gpu import NoGpuProbe
    from nodeagent.signing import NodeKey
    from nodeagent.state import StateDir, write_json
    from tests.nodeagent.no_instances import NoInstances

    node = Node.objects.filter(slots__allocations__isnull=True).first()
    state = StateDir(state_root)
    state.ensure()
    key = NodeKey.generate(state.key_path)
    code = enrolment_code_create(node=node, actor=operator, now=timezone.now())
    answer = StorefrontClient(url).enrol(code=code, public_key=key.public_key_b64(), hostname="n")
    write_json(state.enrolment_path, {"url": url, "node": answer["node"], "credential": answer["credential"],
                                      "poll_seconds": poll_seconds})
    agent = Agent(AgentConfig(storefront_url=url, state_dir=state_root, public_host="203.0.113.7"),
                  runtime=NoInstances(), disks=NoInstances(), probe=NoGpuProbe("test"))
    return agent, node


@pytest.fixture
def wiped(paid_lease, enrol):
    """A lease released, its key destroyed and its disk wiped, with the node that did it."""
    from tests.fleet.helpers import op_of, released  # helpers.py imports this conftest

    lease = paid_lease()
    node = enrol(node_of(lease))
    lease = released(lease, node, timezone.now())
    assert node.report(evidence=[key_destroyed(node, lease, op_id=op_of(node, lease))]).json()["accepted"]
    Lease.objects.filter(pk=lease.pk).update(wipe_by=timezone.now() - timedelta(minutes=1))
    assert node.report(evidence=[disk_wiped(node, lease, op_id=op_of(node, lease))]).json()["accepted"]
    lease.refresh_from_db()
    assert lease.state == LeaseState.WIPED
    return lease, node
