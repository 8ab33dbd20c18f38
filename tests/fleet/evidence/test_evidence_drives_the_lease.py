"""Signed evidence drives the lease: instance_ready makes it active (only verified, only
from its own node), key_destroyed completes the DiskKey's destruction (only when rental
asked for it: nothing is destroyed while paid), disk_wiped wipes it or quarantines the
node. The driver answers rental's sweeps from the same stored evidence."""
import json
from base64 import b64decode
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.utils import timezone

from fleet.crypto import canonical_json
from fleet.driver import NodeAgentDriver
from fleet.models import Evidence
from inventory.models import Incident
from ops.lifecycle import run_lifecycle
from rental.lifecycle import sweep_provisioning
from rental.models import DiskKey, LeaseState, Notification
from tests.fleet.conftest import disk_wiped, key_destroyed, node_of, ready
from tests.fleet.helpers import op_of, released

pytestmark = pytest.mark.django_db
S = LeaseState


def test_verified_instance_ready_makes_the_lease_active(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    op = op_of(node, lease)
    assert NodeAgentDriver().poll_ready(lease_id=lease.pk, started_at=lease.provisioning_started_at,
                                        now=timezone.now()) is None
    record = ready(node, lease, port=22042, op_id=op)
    response = node.report(evidence=[record])
    assert response.json() == {"accepted": ["evidence[0]"], "refused": []}
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE and lease.ssh_command == "ssh -p 22042 root@203.0.113.7"
    assert lease.events.filter(kind="provisioned").count() == 1
    stored = Evidence.objects.get(lease=lease, kind="instance_ready")
    # Stored verbatim: anyone with the node's public key can check it later.
    Ed25519PublicKey.from_public_bytes(b64decode(node.public_key)).verify(b64decode(stored.signature),
                                                                          stored.signed_text.encode())
    assert canonical_json(stored.record) == stored.signed_text.encode()
    # The same evidence again (the agent resends until acknowledged): accepted, applied once.
    assert node.report(evidence=[record]).json()["accepted"] == ["evidence[0]"]
    assert lease.events.filter(kind="provisioned").count() == 1
    # Another record for the same op (different content, validly signed) is a conflict.
    other = ready(node, lease, port=22043, op_id=op)
    assert node.report(evidence=[other]).json()["refused"] == [{"item": "evidence[0]",
                                                                "error": "conflicting_evidence"}]


def test_the_provisioning_sweep_reads_the_evidence_through_the_driver(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert sweep_provisioning(timezone.now()) == []
    stored = ready(node, lease, port=22100)
    # Stored without applying (as if the worker died after the insert): the sweep finishes it.
    Evidence.objects.create(node=node.node, lease=lease, kind="instance_ready", op_id=stored["op_id"], at=timezone.now(),
                            received_at=timezone.now(), record={k: v for k, v in stored.items() if k != "signature"},
                            signature=stored["signature"], signed_text=canonical_json(stored).decode())
    assert [t.what for t in sweep_provisioning(timezone.now())] == ["provisioning → active"]
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE and (lease.host, lease.ssh_port) == ("203.0.113.7", 22100)


def test_evidence_with_a_wrong_signature_is_refused_and_not_applied(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    forged = ready(node, lease)
    forged["ssh_port"] = 2222  # changed after signing
    other = ready(node, lease)
    other["signature"] = other["signature"][:-4] + "AAA="
    response = node.report(evidence=[forged, other])
    assert response.status_code == 200
    assert response.json()["refused"] == [{"item": "evidence[0]", "error": "bad_signature"},
                                          {"item": "evidence[1]", "error": "bad_signature"}]
    assert not Evidence.objects.exists()
    lease.refresh_from_db()
    assert lease.state == S.PROVISIONING


def test_one_bad_item_does_not_block_the_others(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    forged = ready(node, lease, port=1)
    forged["ssh_port"] = 2
    response = node.report(evidence=["junk", forged, ready(node, lease, port=22042)])
    assert response.json() == {"accepted": ["evidence[2]"], "refused": [
        {"item": "evidence[0]", "error": "invalid"}, {"item": "evidence[1]", "error": "bad_signature"}]}
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE


def test_instance_ready_for_an_unpaid_lease_is_refused(catalog, customer, enrol, node_agent_driver):
    from billing.services import checkout_place_order
    from inventory.models import Offer, Site
    from rental.models import Image
    from tests.fleet.conftest import KEY

    lease, _ = checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                    site=Site.objects.get(code="DFW-1"), term="week",
                                    image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                    addons={}, pay_from_balance=False, now=timezone.now())
    node = enrol(node_of(lease))
    assert node.desired().json()["instances"] == []  # not paid: nothing to run
    assert node.report(evidence=[ready(node, lease)]).json()["refused"] == [
        {"item": "evidence[0]", "error": "not_requested"}]
    assert not Evidence.objects.exists()


def test_key_destroyed_completes_the_disk_key_destruction(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    lease = released(lease, node, timezone.now())
    key = DiskKey.objects.get(lease=lease)
    assert key.state == DiskKey.State.DESTROY_REQUESTED  # the driver had no proof yet: not marked done
    assert [t for t in run_lifecycle(timezone.now()) if t[0] == "key_destruction"] == []
    wanted = next(i for i in node.desired().json()["instances"] if i["lease_id"] == lease.pk)
    assert (wanted["want"], wanted["disk"]) == ("absent", "destroy_key")
    # A record that does not prove it (the old key still opens) is refused.
    assert node.report(evidence=[key_destroyed(node, lease, test_exit=0)]).json()["refused"] == [
        {"item": "evidence[0]", "error": "not_proven"}]
    assert node.report(evidence=[key_destroyed(node, lease, op_id=wanted["op_id"])]).json()["accepted"] == [
        "evidence[0]"]
    key.refresh_from_db()
    assert key.state == DiskKey.State.DESTROYED
    proof = json.loads(key.destruction_proof)
    assert proof["record"]["kind"] == "key_destroyed" and proof["public_key"] == node.public_key
    assert proof["signature"] == Evidence.objects.get(kind="key_destroyed").signature
    # The proof stands on its own: the node's key checks the signed text (raises if not).
    Ed25519PublicKey.from_public_bytes(b64decode(proof["public_key"])).verify(b64decode(proof["signature"]),
                                                                              proof["signed"].encode())


def test_nothing_is_destroyed_while_paid(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])
    wanted = node.desired().json()["instances"][0]
    assert (wanted["want"], wanted["disk"]) == ("running", "keep")
    response = node.report(evidence=[key_destroyed(node, lease), disk_wiped(node, lease)])
    assert response.json()["refused"] == [{"item": "evidence[0]", "error": "not_requested"},
                                          {"item": "evidence[1]", "error": "not_requested"}]
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.ACTIVE
    assert NodeAgentDriver().destroy_key(lease_id=lease.pk, key_ref="k", at=timezone.now()) is None
    assert not Evidence.objects.filter(kind__in=["key_destroyed", "disk_wiped"]).exists()


def test_disk_wiped_after_the_key_wipes_the_lease(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    lease = released(lease, node, timezone.now())
    node.desired()
    node.report(evidence=[key_destroyed(node, lease)])
    wanted = node.desired().json()["instances"][0]
    assert (wanted["want"], wanted["disk"]) == ("absent", "wipe")
    unproven = disk_wiped(node, lease, op_id=wanted["op_id"] + "-x",
                          verification={"samples": 64, "nonzero": 3, "pattern": "zero"})  # data left
    assert node.report(evidence=[unproven]).json()["refused"] == [{"item": "evidence[0]", "error": "not_proven"}]
    assert node.report(evidence=[disk_wiped(node, lease, op_id=wanted["op_id"])]).json()["accepted"] == [
        "evidence[0]"]
    lease.refresh_from_db()
    assert lease.state == S.WIPED
    assert json.loads(lease.events.get(kind="wiped").data["receipt"])["record"]["method"] == "discard+overwrite"
    assert node.desired().json()["instances"] == []  # done: the node no longer hears of it


def test_a_failed_wipe_quarantines_the_node(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    lease = released(lease, node, timezone.now())
    node.desired()
    node.report(evidence=[key_destroyed(node, lease)])
    node.desired()
    assert node.report(evidence=[disk_wiped(node, lease, result="failed")]).json()["accepted"] == ["evidence[0]"]
    node.node.refresh_from_db()
    assert node.node.draining
    incident = Incident.objects.get(node=node.node, ends_at__isnull=True)
    assert "disk wipe failed" in incident.reason and incident.source == Incident.Source.HEALTH_CHECK
    lease.refresh_from_db()
    assert lease.state == S.RELEASED  # not wiped: the operator has the disk sanitized first
    assert NodeAgentDriver().wipe(lease_id=lease.pk, at=timezone.now()) is None


def test_provisioning_deadline_fails_refunds_and_frees_the_slots(paid_lease, enrol, customer, settings):
    from billing.models import Account, Invoice, LedgerEntry
    from inventory.models import SlotAllocation

    lease = paid_lease()
    enrol(node_of(lease))
    paid = Invoice.objects.get(lease=lease).amount_cents
    assert Account.objects.get(customer=customer).balance_cents == 0
    now = lease.provisioning_started_at + settings.NODE_PROVISIONING_DEADLINE - timedelta(seconds=1)
    run_lifecycle(now)
    lease.refresh_from_db()
    assert lease.state == S.PROVISIONING
    results = run_lifecycle(now + timedelta(seconds=2))
    assert ("provisioning_deadline", ) == tuple({name for name, t in results if "failed" in t.what})
    lease.refresh_from_db()
    assert lease.state == S.FAILED
    event = lease.events.get(kind="provisioning_failed")
    assert (event.from_state, event.to_state) == ("provisioning", "failed")
    assert not SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).exists()
    assert Account.objects.get(customer=customer).balance_cents == paid
    assert LedgerEntry.objects.get(kind="refund").amount_cents == paid
    notice = Notification.objects.get(lease=lease, kind="provisioning_failed")
    assert "could not be provisioned" in notice.subject
    # Idempotent: another pass refunds nothing more, and no renewal is ever invoiced.
    run_lifecycle(now + timedelta(days=8))
    assert Account.objects.get(customer=customer).balance_cents == paid
    assert not Invoice.objects.filter(lease=lease, kind="renewal").exists()


# -- Evidence counts only for the op the storefront issued, and only once --------

def test_an_old_instance_ready_sent_again_never_moves_the_connection_back(paid_lease, enrol, customer):
    from fleet.services import instance_restart

    lease = paid_lease()
    node = enrol(node_of(lease))
    first_op = op_of(node, lease)
    first = ready(node, lease, port=22042, op_id=first_op)
    assert node.report(evidence=[first]).json()["accepted"] == ["evidence[0]"]
    instance_restart(lease_id=lease.pk, customer=lease.customer, now=timezone.now())
    second_op = op_of(node, lease)
    assert second_op != first_op
    assert node.report(evidence=[ready(node, lease, port=22043, op_id=second_op)]).json()["accepted"] == [
        "evidence[0]"]
    lease.refresh_from_db()
    assert lease.ssh_port == 22043

    # The first record, byte for byte (validly signed, already stored once), sent again.
    assert node.report(evidence=[first]).json()["refused"] == [{"item": "evidence[0]", "error": "stale_op"}]
    lease.refresh_from_db()
    assert lease.ssh_port == 22043 and lease.ssh_command == "ssh -p 22043 root@203.0.113.7"
    assert lease.events.filter(kind="connection_changed").count() == 1


def test_evidence_for_an_op_never_issued_is_refused(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    op = op_of(node, lease)
    lease_part, label, counter = op.split(":")
    invented = [ready(node, lease, op_id=f"{lease_part}:{label}:{int(counter) + 5}"),
                ready(node, lease, op_id=f"{lease_part}:running:x"),
                ready(node, lease, op_id="made-up")]
    assert [r["error"] for r in node.report(evidence=invented).json()["refused"]] == ["not_requested"] * 3
    lease.refresh_from_db()
    assert lease.state == S.PROVISIONING and not Evidence.objects.exists()


def test_disk_evidence_counts_once_and_only_for_its_own_op(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    lease = released(lease, node, timezone.now())
    destroy_op = op_of(node, lease)
    assert ":destroy_key:" in destroy_op
    # A key_destroyed naming the lease's earlier (running) op is an old op, not this one.
    old = key_destroyed(node, lease, op_id=destroy_op.replace(":destroy_key:", ":running:").rsplit(":", 1)[0] + ":1")
    assert node.report(evidence=[old]).json()["refused"] == [{"item": "evidence[0]", "error": "stale_op"}]
    proof = key_destroyed(node, lease, op_id=destroy_op)
    assert node.report(evidence=[proof]).json()["accepted"] == ["evidence[0]"]
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED
    wipe_op = op_of(node, lease)
    assert ":wipe:" in wipe_op
    # The destroy_key op's record re-sent once the wipe was issued: not this op any more.
    assert node.report(evidence=[proof]).json()["refused"] == [{"item": "evidence[0]", "error": "stale_op"}]
    # A disk_wiped naming the destroy_key op (which never asked for a wipe) is refused.
    assert node.report(evidence=[disk_wiped(node, lease, op_id=destroy_op)]).json()["refused"] == [
        {"item": "evidence[0]", "error": "stale_op"}]
    wiped = disk_wiped(node, lease, op_id=wipe_op)
    assert node.report(evidence=[wiped]).json()["accepted"] == ["evidence[0]"]
    lease.refresh_from_db()
    assert lease.state == S.WIPED and lease.events.filter(kind="wiped").count() == 1
    # Resent until acknowledged (the answer was lost): accepted, applied once.
    assert node.report(evidence=[wiped]).json()["accepted"] == ["evidence[0]"]
    assert lease.events.filter(kind="wiped").count() == 1
    assert Evidence.objects.filter(lease=lease, kind="disk_wiped").count() == 1
