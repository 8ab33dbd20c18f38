"""The lease lifecycle's contract, run against every HOST_AGENT: order →
provision → renew → suspend → release → key destroyed → wiped, with the timers of
rental/rules.py (set here to values no code may retype). The same steps and the same
expected outcome for the demo's FakeAgent and for production's NodeAgentDriver with a
scripted node speaking the real agent API (GET desired, signed reports carrying Ed25519
evidence), so the fake can never again differ from production unnoticed.

Both run on one simulated clock: lifecycle passes get it as `now`, and the node's HTTP
turns see it as the storefront's clock (and sign it as their own)."""
import base64
import hashlib
import hmac
import json
from contextlib import contextmanager
from datetime import timedelta
from unittest import mock

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.test import Client
from django.utils import timezone

from billing.models import Invoice
from billing.services import balance_top_up, checkout_place_order
from fleet.services import enrolment_code_create
from inventory.models import Offer, Site
from ops.lifecycle import run_lifecycle
from rental import rules
from rental.models import DiskKey, Image, Lease, LeaseState, Notification

from .conftest import KEY, FakeNode, disk_wiped, key_destroyed, node_of, ready

S = LeaseState


@contextmanager
def clock(at):
    """The storefront's clock reads `at` (what `manage.py lifecycle --at` does for passes)."""
    with mock.patch.object(timezone, "now", return_value=at):
        yield


class FakeHost:
    """rental.agent.FakeAgent: answers every question itself, at once."""

    agent = "rental.agent.FakeAgent"

    def attach(self, lease, operator):
        pass

    def turn(self, now):
        pass

    def proven(self, proof: str) -> tuple[str, int] | None:
        """(what the receipt proves, for which lease), when the server's MAC checks."""
        message, _, mac = proof.rpartition(":hmac-sha256=")
        if not hmac.compare_digest(mac, hmac.new(settings.SECRET_KEY.encode(), message.encode(),
                                                 hashlib.sha256).hexdigest()):
            return None
        action, lease_id = message.split(":")[:2]
        return {"luks-key-destroyed": "key_destroyed", "nvme-wiped": "disk_wiped"}[action], int(lease_id)


class ScriptedNode(FakeNode):
    """A node agent reduced to its protocol: each turn it fetches its desired state and
    does what each op asks once (runs the instance, stops it, destroys the key, wipes the
    disk), reporting the signed evidence for it, as nodeagent/converge.py does."""

    def __init__(self, node, client):
        super().__init__(node, client)
        self.done: dict[str, str] = {}  # op_id → what the node did

    def turn(self, now) -> bool:
        with clock(now):
            response = self.desired()
            assert response.status_code == 200, response.content
            evidence = []
            for item in response.json()["instances"]:
                if item["op_id"] in self.done:
                    continue
                lease = Lease.objects.get(pk=item["lease_id"])
                action = item["want"] if item["disk"] == "keep" else item["disk"]
                self.done[item["op_id"]] = action
                if action == "running":
                    evidence.append(ready(self, lease, op_id=item["op_id"]))
                elif action == "destroy_key":
                    evidence.append(key_destroyed(self, lease, op_id=item["op_id"]))
                elif action == "wipe":
                    evidence.append(disk_wiped(self, lease, op_id=item["op_id"]))
            response = self.post(self.body(evidence=evidence))
            assert response.status_code == 200, response.content
            assert len(response.json()["accepted"]) == len(evidence), response.json()
            return bool(evidence)


class NodeHost:
    """fleet.driver.NodeAgentDriver with a scripted node: nothing happens until the node
    polled, acted and proved it."""

    agent = "fleet.driver.NodeAgentDriver"

    def attach(self, lease, operator):
        node = node_of(lease)
        self.node = ScriptedNode(node, Client())
        with clock(lease.provisioning_started_at):
            code = enrolment_code_create(node=node, actor=operator, now=timezone.now())
            assert self.node.enrol(code).status_code == 200

    def turn(self, now):
        for _ in range(5):  # until the node has nothing left to do
            if not self.node.turn(now):
                return
        raise AssertionError("the node never settled")

    def proven(self, proof: str) -> tuple[str, int] | None:
        """(what the signed record proves, for which lease), when this node's key signed it."""
        proof = json.loads(proof)
        if proof["public_key"] != self.node.public_key:
            return None
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(proof["public_key"]))
        key.verify(base64.b64decode(proof["signature"]), proof["signed"].encode())  # raises if forged
        record = json.loads(proof["signed"])
        return record["kind"], record["lease_id"]


@pytest.fixture(params=[FakeHost, NodeHost], ids=["FakeAgent", "NodeAgentDriver"])
def host(request, settings):
    settings.HOST_AGENT = request.param.agent
    settings.HOST_AGENT_FAKE_DELAY = 0
    # Timers unlike the defaults, read through rental.rules: a retyped constant shows.
    settings.LEASE_HOLD_HOURS = 50
    settings.LEASE_RENEWAL_LEAD_HOURS = 30
    settings.LEASE_WIPE_WITHIN_DAYS = 5
    settings.LEASE_REMINDER_LEAD_HOURS = [60, 6]
    return request.param()


def tick(host, now):
    """One lifecycle pass at `now`, the host's turn (a node polls and reports), another pass."""
    run_lifecycle(now)
    host.turn(now)
    run_lifecycle(now)


def refreshed(lease):
    lease.refresh_from_db()
    return lease


@pytest.mark.django_db
def test_the_lifecycle_contract(host, catalog, customer, operator):
    t0 = timezone.now().replace(microsecond=0)
    offer = Offer.objects.get(slug="rtx-3090")
    balance_top_up(customer=customer, amount_cents=2 * 6500, now=t0)
    lease, _ = checkout_place_order(customer=customer, offer=offer, site=Site.objects.get(code="DFW-1"),
                                    term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"),
                                    ssh_public_key=KEY, pay_from_balance=True, now=t0)
    assert refreshed(lease).state == S.PROVISIONING
    host.attach(lease, operator)

    # Provision: the term starts when the instance is ready.
    tick(host, t0)
    assert refreshed(lease).state == S.ACTIVE and lease.started_at == t0
    end = t0 + timedelta(days=7)
    assert lease.ends_at == end and lease.host and lease.ssh_port

    # Reminders from each lead, the renewal invoice from the renewal lead (not before).
    first_lead, second_lead = (lead for _, lead in rules.reminders())
    tick(host, end - first_lead - timedelta(minutes=1))
    assert not Notification.objects.filter(lease=lease).exists()
    tick(host, end - first_lead)
    assert list(Notification.objects.filter(lease=lease).values_list("kind", flat=True)) == ["reminder_60h"]
    tick(host, end - rules.renewal_lead() - timedelta(minutes=1))
    assert not Invoice.objects.filter(lease=lease, kind="renewal").exists()
    tick(host, end - rules.renewal_lead())
    # Renew: the invoice is paid from the balance (auto-renew) and the term runs on from the old end.
    renewal = Invoice.objects.get(lease=lease, kind="renewal")
    assert renewal.state == Invoice.State.PAID and renewal.term_start == end
    tick(host, end)
    assert refreshed(lease).state == S.ACTIVE and lease.ends_at == end + timedelta(days=7)
    renewed_at, end = end - rules.renewal_lead(), lease.ends_at

    # Suspend: the next term ends unpaid (the balance is spent); the hold and the wipe deadline count from the stop.
    tick(host, end - second_lead)
    tick(host, end - timedelta(minutes=1))
    assert refreshed(lease).state == S.ACTIVE
    tick(host, end)
    assert refreshed(lease).state == S.SUSPENDED and lease.suspended_at == end
    assert lease.hold_until == end + rules.hold() == end + timedelta(hours=50)
    assert lease.wipe_by == end + rules.wipe_within() == end + timedelta(days=5)
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.ACTIVE

    # Release at the hold's end (not a minute before); the key is destroyed and the disk
    # wiped in the same turn, days before wipe_by (only the deadline alerts watch).
    tick(host, lease.hold_until - timedelta(minutes=1))
    assert refreshed(lease).state == S.SUSPENDED
    released_at = lease.hold_until
    tick(host, released_at)
    assert refreshed(lease).state == S.WIPED and lease.ended_at == released_at < lease.wipe_by
    key = DiskKey.objects.get(lease=lease)
    assert key.state == DiskKey.State.DESTROYED and key.destroyed_at == released_at
    assert host.proven(key.destruction_proof) == ("key_destroyed", lease.pk)
    assert host.proven(lease.events.get(kind="wiped").data["receipt"]) == ("disk_wiped", lease.pk)

    events = [(e.kind, e.at) for e in lease.events.order_by("id")]
    assert events == [("created", t0), ("paid", t0), ("provisioned", t0),
                      ("extended", renewed_at),
                      ("suspended", end), ("released", released_at), ("key_destroy_requested", released_at),
                      ("key_destroyed", released_at), ("wiped", released_at)]
    first_end = end - timedelta(days=7)
    assert sorted(Notification.objects.filter(lease=lease).values_list("kind", "deadline")) == sorted([
        ("reminder_60h", first_end), ("renewal_invoice", first_end),
        ("reminder_6h", end), ("renewal_invoice", end),
        ("suspended", lease.hold_until), ("released", released_at)])
