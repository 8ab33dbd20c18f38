"""The rules of fleet/evidence.py that the first mutation runs found unread — which
signed record is accepted, which refused with which code (nodeagent/PROTOCOL.md, "Evidence
records"), what an accepted one changes, and when it quarantines a node. Every record here is
signed by the node's own key: what is refused is refused for what it says, not its signature."""
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.crypto import canonical_json
from fleet.models import Evidence
from fleet.services import instance_restart, instance_restore, instance_stop
from inventory.models import AuditEntry, Incident, Node
from rental.failover import lease_migrate
from rental.models import DiskKey, Lease, LeaseState, Snapshot
from rental.storage import lease_restore_from_set
from tests.fleet.conftest import (
    disk_wiped,
    key_destroyed,
    node_of,
    provision_then_release,
    ready,
    rfc3339,
)
from tests.fleet.helpers import ready_snapshot, refused, snapshot_taken, taking

pytestmark = pytest.mark.django_db
S = LeaseState


def signed(sender, record: dict, /, **changes) -> dict:
    """`record` with `changes` (any field, `node` too), signed by `sender` again."""
    record = {k: v for k, v in record.items() if k != "signature"} | changes
    return {**record, "signature": sender.sign(canonical_json(record))}


def answer(node, *records) -> dict:
    response = node.report(evidence=list(records))
    assert response.status_code == 200
    return response.json()


def error(node, record) -> str:
    """The code the one refused record gets (nothing accepted)."""
    [item] = refused(node, record)
    return item["error"]


def accepted(node, *records) -> bool:
    return answer(node, *records) == {"accepted": [f"evidence[{i}]" for i in range(len(records))], "refused": []}


def at_the_wipe(paid_lease, enrol, node=None):
    """A released lease whose key the node proved destroyed: the node is asked to wipe."""
    lease = paid_lease()
    node = node or enrol(node_of(lease))
    provision_then_release(node, lease)
    assert accepted(node, key_destroyed(node, lease))
    wipe_op = node.issued_op(lease)
    assert ":wipe:" in wipe_op
    return node, lease, wipe_op


# -- the common fields ----------------------------------------------------------------------

def test_a_record_of_no_known_kind_time_node_or_lease_is_refused_with_its_code(paid_lease, enrol):
    """`kind` one of the protocol's, `at` an RFC 3339 time with a zone, `node` the sender's
    own name, `lease_id` a lease of this node (any integer from 1 to 2⁶² is read as one)."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    other = Node.objects.exclude(pk=node.node.pk).first()
    good = ready(node, lease)
    cases = [
        ({"kind": "instance_started"}, "unknown_kind"),
        ({"kind": None}, "unknown_kind"),
        ({"at": None}, "invalid"),
        ({"at": "yesterday"}, "invalid"),
        ({"at": "2026-12-04T10:00:00"}, "invalid"),             # no zone
        ({"at": 1764842400}, "invalid"),
        ({"node": other.name}, "wrong_node"),
        ({"node": None}, "wrong_node"),
        ({"lease_id": 2**62}, "unknown_lease"),
        ({"lease_id": 2**62 + 1}, "invalid"),
        # lease 1 is a lease id like any other (this node's only lease when the database is new)
        ({"lease_id": 1, "op_id": "1:running:99"}, "not_requested" if lease.pk == 1 else "unknown_lease"),
    ]
    for changes, code in cases:
        assert refused(node, signed(node, good, **changes)) == [{"item": "evidence[0]", "error": code}], changes
    assert not Evidence.objects.exists()
    lease.refresh_from_db()
    assert lease.state == S.PROVISIONING

    before = timezone.now()
    assert accepted(node, good)
    stored = Evidence.objects.get()
    # Stored as signed, without the signature (kept beside it), at the node's time and ours.
    assert stored.record == {k: v for k, v in good.items() if k != "signature"}
    assert (stored.node, stored.lease_id, stored.kind, stored.op_id) == (node.node, lease.pk, "instance_ready",
                                                                        good["op_id"])
    assert stored.signature == good["signature"] and rfc3339(stored.at) == good["at"]
    assert before <= stored.received_at <= timezone.now()


# -- sent again: counted once, whatever other record shares its node, lease, kind or op --------

def test_a_ready_sent_again_after_a_restart_is_the_restart_s_record(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert accepted(node, ready(node, lease, port=22042))
    instance_restart(lease_id=lease.pk, customer=lease.customer, now=timezone.now())
    second = ready(node, lease, port=22043)
    assert accepted(node, second)
    assert accepted(node, second)                       # the answer was lost: sent again
    assert Evidence.objects.filter(lease=lease, kind="instance_ready").count() == 2
    lease.refresh_from_db()
    assert lease.ssh_port == 22043 and lease.events.filter(kind="connection_changed").count() == 1


def test_after_a_migration_the_new_node_s_ready_sent_again_is_its_own(paid_lease, enrol):
    """Both nodes' first running op of the lease is `<lease>:running:1`."""
    lease = paid_lease()
    source = enrol(node_of(lease))
    first = ready(source, lease, port=22042)
    assert accepted(source, first)
    lease_migrate(lease_id=lease.pk, from_node=source.node, now=timezone.now(), reason="test", copy=False)
    target = enrol(node_of(lease))
    moved = ready(target, lease, port=23001)
    assert moved["op_id"] == first["op_id"]
    assert accepted(target, moved)
    assert accepted(target, moved)
    assert Evidence.objects.filter(lease=lease, kind="instance_ready").count() == 2
    lease.refresh_from_db()
    assert lease.ssh_port == 23001


def test_a_wipe_op_asks_for_the_key_s_destruction_too(paid_lease, enrol):
    """A node that has no record of destroying the key (its journal lost) destroys it again
    for the wipe op, then wipes: both records answer that op, both are accepted, and each
    sent again is the same record."""
    node, lease, wipe_op = at_the_wipe(paid_lease, enrol)
    again = key_destroyed(node, lease, op_id=wipe_op)
    wiped = disk_wiped(node, lease, op_id=wipe_op)
    assert accepted(node, again, wiped)
    assert accepted(node, again, wiped)
    assert Evidence.objects.filter(lease=lease, op_id=wipe_op).count() == 2
    assert lease.events.filter(kind="key_destroyed").count() == 1
    lease.refresh_from_db()
    assert lease.state == S.WIPED


# -- key_destroyed and disk_wiped: what proves it --------------------------------------------

def test_a_key_destruction_proves_no_keyslot_left_and_no_passphrase_that_opens(paid_lease, enrol):
    """`keyslots_after` an integer from 0 to 64, `test_passphrase_exit` one from −255 to 255:
    anything else is `invalid`; a keyslot left, or the old passphrase opening (exit 0), is
    `not_proven`. A failure killed by a signal (−255) proves it as well as any other."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    provision_then_release(node, lease)
    cases = [
        ({"keyslots_after": -1}, "invalid"),
        ({"keyslots_after": 65}, "invalid"),
        ({"keyslots_after": "0"}, "invalid"),
        ({"keyslots_after": None}, "invalid"),
        ({"test_passphrase_exit": -256}, "invalid"),
        ({"test_passphrase_exit": 256}, "invalid"),
        ({"test_passphrase_exit": None}, "invalid"),
        ({"keyslots_after": 1}, "not_proven"),
        ({"keyslots_after": 64}, "not_proven"),
        ({"test_passphrase_exit": 0}, "not_proven"),
    ]
    for changes, code in cases:
        assert error(node, signed(node, key_destroyed(node, lease), **changes)) == code, changes
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROY_REQUESTED
    assert accepted(node, key_destroyed(node, lease, test_exit=-255))
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED


def test_a_wipe_is_proven_by_blocks_read_back_as_its_method_promises(paid_lease, enrol):
    """`result` is `ok` or `failed`. An `ok` needs an integer `samples` above 0 and, unless
    the record names another pattern (a crypto erase reads back as noise), `nonzero: 0`."""
    node, lease, wipe_op = at_the_wipe(paid_lease, enrol)
    record = disk_wiped(node, lease, op_id=wipe_op)
    cases = [
        ({"result": "OK"}, "invalid"),
        ({"result": "partial"}, "invalid"),
        ({"result": None}, "invalid"),
        ({"verification": "all zero"}, "not_proven"),
        ({"verification": None}, "not_proven"),
        ({"verification": {"nonzero": 0, "pattern": "zero"}}, "not_proven"),
        ({"verification": {"samples": "64", "nonzero": 0}}, "not_proven"),
        ({"verification": {"samples": 64.0, "nonzero": 0}}, "not_proven"),
        ({"verification": {"samples": True, "nonzero": 0}}, "not_proven"),
        ({"verification": {"samples": 0, "nonzero": 0, "pattern": "zero"}}, "not_proven"),
        ({"verification": {"samples": 64, "nonzero": 3}}, "not_proven"),          # zero is the default
        ({"verification": {"samples": 64, "pattern": "zero"}}, "not_proven"),     # nonzero not counted
        ({"verification": {"samples": 0, "nonzero": 0, "pattern": "random"}}, "not_proven"),
    ]
    for changes, code in cases:
        assert error(node, signed(node, record, **changes)) == code, changes
    lease.refresh_from_db()
    assert lease.state == S.RELEASED and not Evidence.objects.filter(kind="disk_wiped").exists()
    assert accepted(node, signed(node, record, verification={"samples": 1, "nonzero": 0}))
    lease.refresh_from_db()
    assert lease.state == S.WIPED

    # A crypto erase: one block read back, noise, is its proof.
    node, crypto, wipe_op = at_the_wipe(paid_lease, enrol, node=node)
    noise = signed(node, disk_wiped(node, crypto, op_id=wipe_op), method="sanitize-crypto", nist_category="purge",
                   verification={"samples": 1, "nonzero": 1, "pattern": "random"})
    assert accepted(node, noise)
    crypto.refresh_from_db()
    assert crypto.state == S.WIPED
    node.node.refresh_from_db()
    assert not node.node.draining


def test_each_failed_wipe_quarantines_its_node_with_the_node_s_reason(paid_lease, enrol):
    """A `failed` wipe needs no verification: the node drains (audited with the lease), and a
    degraded incident from the health check names the lease and the node's `detail` (else
    its `method`), at the time the record arrived. The next lease goes to another node."""
    cases = [({"detail": "sanitize: status 0x2 (" + "x" * 130 + ")"},
              "sanitize: status 0x2 (" + "x" * 98),                     # cut at 120 characters
             ({"detail": ""}, "discard+overwrite"),
             ({"detail": None, "method": None}, "")]
    seen = set()
    for changes, detail in cases:
        node, lease, wipe_op = at_the_wipe(paid_lease, enrol)
        assert node.node.pk not in seen
        seen.add(node.node.pk)
        record = signed(node, disk_wiped(node, lease, op_id=wipe_op, result="failed"), verification=None, **changes)
        assert accepted(node, record)
        node.node.refresh_from_db()
        assert node.node.draining
        drained = AuditEntry.objects.get(action="node_drain", object_id=str(node.node.pk))
        assert drained.detail == {"reason": f"disk wipe failed for lease #{lease.pk}"}
        incident = Incident.objects.get(node=node.node, ends_at__isnull=True)
        assert (incident.kind, incident.source) == (Incident.Kind.DEGRADED, Incident.Source.HEALTH_CHECK)
        assert incident.reason == f"quarantined: disk wipe failed for lease #{lease.pk} {detail}".strip()
        assert incident.starts_at == Evidence.objects.get(lease=lease, kind="disk_wiped").received_at
        lease.refresh_from_db()
        assert lease.state == S.RELEASED


# -- snapshot_taken ------------------------------------------------------------------------


def test_a_snapshot_is_made_ready_by_its_current_attempt_s_record_only(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert accepted(node, ready(node, lease))
    snap = taking(lease, attempt=2, created_at=timezone.now() - timedelta(minutes=5))
    newer = taking(lease)                               # taken after it (one at a time)
    others = taking(paid_lease())
    assert node.desired().json()["instances"][0]["snapshot"]["op_id"] == snap.op_id
    assert error(node, snapshot_taken(node, lease, snap, op_id=f"snap:{snap.pk}:1")) == "not_requested"  # older attempt
    assert error(node, snapshot_taken(node, lease, others)) == "not_requested"   # another lease's snapshot
    assert error(node, snapshot_taken(node, lease, snap, op_id=f"{lease.pk}:running:1")) == "not_requested"
    assert set(Snapshot.objects.values_list("state", flat=True)) == {Snapshot.State.CREATING}

    record = snapshot_taken(node, lease, snap)
    assert accepted(node, record)
    assert accepted(node, record)                        # sent again: the same record
    snap.refresh_from_db()
    assert snap.state == Snapshot.State.AVAILABLE
    assert (snap.restic_snapshot, snap.content_bytes, snap.stored_bytes) == ("9c2f41ab", 5 * 10**9, 2 * 10**9)
    assert snap.ready_at == Evidence.objects.get(kind="snapshot_taken").received_at
    assert lease.events.filter(kind="snapshot_ready").count() == 1
    assert Snapshot.objects.get(pk=newer.pk).state == Snapshot.State.CREATING
    others.refresh_from_db()
    assert others.state == Snapshot.State.CREATING


def test_the_fields_of_a_snapshot_record_are_checked_before_its_op(paid_lease, enrol):
    """`snapshot_id` an integer from 1 to 2⁶², `restic_snapshot` a string of 1–80 characters,
    `bytes` and `stored_bytes` integers from 0 to 2⁶²: anything else is `invalid`. Within
    those, a record of an older attempt is read, and refused as not requested."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    snap = taking(lease, attempt=2)
    old = snapshot_taken(node, lease, snap, op_id=f"snap:{snap.pk}:1")
    cases = [
        ({"snapshot_id": 0}, "invalid"), ({"snapshot_id": 1}, "not_requested"),
        ({"snapshot_id": 2**62}, "not_requested"), ({"snapshot_id": 2**62 + 1}, "invalid"),
        ({"snapshot_id": str(snap.pk)}, "invalid"),
        ({"restic_snapshot": ""}, "invalid"), ({"restic_snapshot": "a" * 80}, "not_requested"),
        ({"restic_snapshot": "a" * 81}, "invalid"), ({"restic_snapshot": None}, "invalid"),
        ({"bytes": -1}, "invalid"), ({"bytes": 0}, "not_requested"), ({"bytes": 2**62}, "not_requested"),
        ({"bytes": 2**62 + 1}, "invalid"), ({"bytes": 1.5}, "invalid"),
        ({"stored_bytes": -1}, "invalid"), ({"stored_bytes": 0}, "not_requested"),
        ({"stored_bytes": 2**62}, "not_requested"), ({"stored_bytes": 2**62 + 1}, "invalid"),
        ({"stored_bytes": None}, "invalid"),
    ]
    for changes, code in cases:
        assert error(node, signed(node, old, **changes)) == code, changes
    assert not Evidence.objects.exists()
    # The current attempt's record of an empty disk: nothing copied is a snapshot too.
    assert accepted(node, snapshot_taken(node, lease, snap, bytes=0, stored_bytes=0, files=0))
    snap.refresh_from_db()
    assert (snap.state, snap.content_bytes, snap.stored_bytes) == (Snapshot.State.AVAILABLE, 0, 0)


def test_once_the_lease_moved_its_snapshot_is_the_new_node_s_to_take(paid_lease, enrol):
    lease = paid_lease()
    source = enrol(node_of(lease))
    assert accepted(source, ready(source, lease))
    snap = taking(lease)
    lease_migrate(lease_id=lease.pk, from_node=source.node, now=timezone.now(), reason="test", copy=False)
    target = enrol(node_of(lease))
    assert target.node != source.node
    assert target.desired().json()["instances"][0]["snapshot"]["op_id"] == snap.op_id
    assert error(source, snapshot_taken(source, lease, snap)) == "not_requested"
    assert Snapshot.objects.get(pk=snap.pk).state == Snapshot.State.CREATING
    assert accepted(target, snapshot_taken(target, lease, snap))
    assert Snapshot.objects.get(pk=snap.pk).state == Snapshot.State.AVAILABLE


# -- snapshot_restored -----------------------------------------------------------------------

def snapshot_restored(node, lease, snap, op_id="", **fields):
    return node.evidence("snapshot_restored", lease, op_id,
                         **({"snapshot_id": snap.pk, "restic_snapshot": "4f1c2b9e", "bytes": 10**9} | fields))


def test_a_new_lease_s_restore_counts_only_for_the_snapshot_it_was_ordered_from(paid_lease, enrol):
    """`snapshot_restored` answers the lease's running op (no `stored_bytes`: nothing is
    stored); a record of another snapshot, even one another lease restores, is refused."""
    earlier = paid_lease()
    snap, elsewhere = ready_snapshot(earlier), ready_snapshot(earlier)
    lease, other = paid_lease(), paid_lease()
    lease_restore_from_set(lease=lease, snapshot=snap, now=timezone.now())
    lease_restore_from_set(lease=other, snapshot=elsewhere, now=timezone.now())
    node = enrol(node_of(lease))
    assert error(node, snapshot_restored(node, lease, elsewhere)) == "not_requested"
    assert error(node, snapshot_restored(node, lease, ready_snapshot(earlier))) == "not_requested"
    assert Lease.objects.get(pk=lease.pk).restored_at is None

    restored = snapshot_restored(node, lease, snap)
    assert "stored_bytes" not in restored
    assert accepted(node, restored)
    stored = Evidence.objects.get(kind="snapshot_restored")
    lease.refresh_from_db()
    assert lease.restored_at == stored.received_at
    assert lease.events.get(kind="snapshot_restored").data["snapshot"] == snap.pk
    # The instance then starts under the same op: both records resent, each the same.
    started = ready(node, lease, op_id=restored["op_id"])
    assert accepted(node, started)
    assert accepted(node, restored, started)
    assert Evidence.objects.filter(lease=lease, op_id=restored["op_id"]).count() == 2
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE and Lease.objects.get(pk=other.pk).restored_at is None


def test_a_restore_into_a_stopped_lease_is_answered_under_its_own_op_only(paid_lease, enrol):
    """The customer's restore into the stopped instance's disk has the op_id
    `restore:<lease>:<event>`: only a `snapshot_restored` of that restore, from the node the
    lease is on, answers it; no other kind of record can name it."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert accepted(node, ready(node, lease, port=22042))
    snap = ready_snapshot(lease)
    instance_stop(lease_id=lease.pk, customer=lease.customer, now=timezone.now())
    event = instance_restore(lease_id=lease.pk, customer=lease.customer, snapshot_id=snap.pk, now=timezone.now())
    op = f"restore:{lease.pk}:{event.pk}"
    item = node.desired().json()["instances"][0]
    assert (item["want"], item["restore"]["op_id"]) == ("stopped", op)
    assert error(node, ready(node, lease, port=22999, op_id=op)) == "not_requested"
    assert error(node, snapshot_restored(node, lease, snap, op_id=f"restore:{lease.pk}:{event.pk + 1}")) == \
        "not_requested"
    assert error(node, snapshot_restored(node, lease, ready_snapshot(lease), op_id=op)) == "not_requested"
    lease.refresh_from_db()
    assert lease.restored_at is None and lease.ssh_port == 22042

    assert accepted(node, snapshot_restored(node, lease, snap, op_id=op))
    lease.refresh_from_db()
    assert lease.restored_at == Evidence.objects.get(kind="snapshot_restored").received_at
    assert "restore" not in node.desired().json()["instances"][0]

