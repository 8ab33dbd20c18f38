"""The desired-state document's rules as a node agent reads them (nodeagent/PROTOCOL.md):
each lease's op_id (`<lease>:<want or disk op>:<counter>`, a new one only when something
changed, since a new op_id on a running instance means "restart it"), and the snapshot op
a running instance carries."""
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.services import instance_restart
from rental.failover import node_evacuate
from rental.models import Snapshot
from tests.fleet.conftest import key_destroyed, node_of, ready
from tests.fleet.helpers import ready_snapshot, taking

pytestmark = pytest.mark.django_db


def items(node) -> dict[int, dict]:
    return {item["lease_id"]: item for item in node.desired().json()["instances"]}


def test_each_lease_on_a_node_gets_its_own_op_id(paid_lease, enrol):
    first, second = paid_lease(), paid_lease()
    assert node_of(first) == node_of(second)
    node = enrol(node_of(first))
    ops = {lease_id: item["op_id"] for lease_id, item in items(node).items()}
    assert ops == {first.pk: f"{first.pk}:running:1", second.pk: f"{second.pk}:running:1"}


def test_op_ids_name_the_want_then_the_disk_work_over_a_lease_s_life(paid_lease, enrol):
    """running, stopped at the term's end, then (released) the key's destruction and the
    wipe: each a new op named after what it asks, the counter never reused."""
    from rental.services import lease_release, lease_suspend

    lease = paid_lease()
    node = enrol(node_of(lease))
    seen = [items(node)[lease.pk]["op_id"]]
    node.report(evidence=[ready(node, lease)])
    lease.refresh_from_db()
    lease_suspend(lease_id=lease.pk, now=lease.ends_at)
    seen.append(items(node)[lease.pk]["op_id"])
    lease.refresh_from_db()
    lease_release(lease_id=lease.pk, now=lease.hold_until)
    seen.append(items(node)[lease.pk]["op_id"])
    node.report(evidence=[key_destroyed(node, lease)])
    seen.append(items(node)[lease.pk]["op_id"])
    assert seen == [f"{lease.pk}:{op}:{n}" for n, op in enumerate(["running", "stopped", "destroy_key", "wipe"], 1)]


def test_after_a_migration_a_restarted_lease_s_op_id_holds_still_on_the_new_node(paid_lease, enrol, operator):
    """The customer's earlier restart is not a new one on the node the lease moves to: the
    new node's op_id stays the same poll after poll (a new one would restart the instance)."""
    lease = paid_lease()
    source = enrol(node_of(lease))
    source.report(evidence=[ready(source, lease)])
    instance_restart(lease_id=lease.pk, customer=lease.customer, now=timezone.now())
    node_evacuate(node=source.node, actor=operator, now=timezone.now())
    target = enrol(node_of(lease))
    first = items(target)[lease.pk]
    assert (first["want"], first["op_id"]) == ("running", f"{lease.pk}:running:1")
    assert items(target)[lease.pk]["op_id"] == first["op_id"]


def test_after_a_migration_the_new_node_can_report_ready_before_the_old_node_polls(paid_lease, enrol, operator):
    """The new node's op is its own from its first poll, whatever the old node was last told."""
    lease = paid_lease()
    source = enrol(node_of(lease))
    source.report(evidence=[ready(source, lease, port=22042)])
    node_evacuate(node=source.node, actor=operator, now=timezone.now())
    target = enrol(node_of(lease))
    assert target.report(evidence=[ready(target, lease, port=23001)]).json()["accepted"] == ["evidence[0]"]
    lease.refresh_from_db()
    assert lease.ssh_port == 23001


def test_a_customer_snapshot_is_taken_while_the_instance_keeps_running(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    snap = taking(lease)
    item = items(node)[lease.pk]
    assert (item["want"], item["op_id"]) == ("running", f"{lease.pk}:running:1")
    assert item["snapshot"] == {"op_id": f"snap:{snap.pk}:1", "snapshot_id": snap.pk, "repository": {
        "url": "s3:https://rgw.example/snap", "access_key": "AK1", "secret_key": "s3-secret",
        "password": "restic-password"}}


def test_a_migration_snapshot_stops_the_instance_while_it_is_taken(paid_lease, enrol):
    """The lease moving off a node that answers stops there first, so that the copy
    holds everything written; the migration's copy is taken before a customer's."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    taking(lease)
    move = taking(lease, purpose=Snapshot.Purpose.MIGRATION)
    item = items(node)[lease.pk]
    assert (item["want"], item["disk"], item["op_id"]) == ("stopped", "keep", f"{lease.pk}:stopped:1")
    assert item["snapshot"]["snapshot_id"] == move.pk


def test_a_snapshot_retry_is_sent_once_it_is_due(paid_lease, enrol):
    """A failed attempt's next one waits SNAPSHOT_RETRY_SECONDS: not in the document before
    its moment, in it from that moment on."""
    from fleet.desired import desired_document

    lease = paid_lease()
    node = enrol(node_of(lease)).node
    due = timezone.now() + timedelta(seconds=60)
    snap = taking(lease, attempt=2, attempt_started_at=due)

    def op_at(now):
        [item] = desired_document(node=node, now=now)["instances"]
        return item.get("snapshot", {}).get("op_id")

    assert op_at(due - timedelta(seconds=1)) is None
    assert op_at(due) == op_at(due + timedelta(seconds=1)) == f"snap:{snap.pk}:2"


def test_a_restore_into_a_suspended_lease_keeps_it_stopped_once_paid_until_restored(paid_lease, enrol):
    """The snapshot replaces the disk of a stopped instance (`restore` with `replace`
    and its own op_id); paying for the lease meanwhile does not start it over the restore."""
    from fleet.services import instance_restore
    from rental.services import lease_extend, lease_suspend

    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])
    snap = ready_snapshot(lease)
    lease.refresh_from_db()
    lease_suspend(lease_id=lease.pk, now=lease.ends_at)
    event = instance_restore(lease_id=lease.pk, customer=lease.customer, snapshot_id=snap.pk, now=lease.ends_at)
    restore = {"op_id": f"restore:{lease.pk}:{event.pk}", "replace": True, "snapshot_id": snap.pk,
               "restic_snapshot": "4f1c2b9e", "repository": {"url": "s3:https://rgw.example/snap",
                                                             "access_key": "AK1", "secret_key": "s3-secret",
                                                             "password": "restic-password"}}
    item = items(node)[lease.pk]
    assert (item["want"], item["restore"]) == ("stopped", restore)
    assert lease_extend(lease_id=lease.pk, term_start=lease.ends_at, now=lease.ends_at)
    item = items(node)[lease.pk]
    assert (item["want"], item["restore"]) == ("stopped", restore)
    # The snapshot deleted before the node restored it: its repository is gone, nothing to restore.
    Snapshot.objects.filter(pk=snap.pk).update(key_destroyed_at=timezone.now())
    assert "restore" not in items(node)[lease.pk]


def test_a_steady_node_s_document_is_computed_with_reads_alone(paid_lease, enrol):
    """Once its ops are issued, polling a node whose leases did not change writes
    nothing and takes no lock (no transaction): a steady fleet's polls are reads."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.desired import desired_document

    lease = paid_lease()
    paid_lease()                                    # a second lease on the same node
    node = enrol(node_of(lease)).node
    before = desired_document(node=node, now=timezone.now())["instances"]
    with CaptureQueriesContext(connection) as queries:
        assert desired_document(node=node, now=timezone.now())["instances"] == before
    assert [q["sql"] for q in queries.captured_queries if not q["sql"].startswith("SELECT")] == []


def test_a_running_instance_lists_its_attached_volume_and_a_stopped_one_none(paid_lease, enrol):
    """Each `running` item lists the attached volumes its node's key reaches."""
    from fleet.services import instance_stop
    from rental.models import NetworkVolume, VolumeAttachment
    from storage.models import NodeStorageKey, VolumeStore

    lease = paid_lease()
    node = enrol(node_of(lease))
    now = timezone.now()
    volume = NetworkVolume.objects.create(customer=lease.customer, site=lease.site, name="data", size_tb=1,
                                          created_at=now, paid_until=now + timedelta(days=30))
    VolumeStore.objects.create(volume=volume, subvolume="nv-data", path="/volumes/storefront/nv-data/u1",
                               quota_bytes=10**12, created_at=now)
    VolumeAttachment.objects.create(volume=volume, lease=lease, attached_at=now)
    NodeStorageKey.objects.create(node=node.node, auth_id=f"storefront-node-{node.node.pk}", granted=["nv-data"])
    assert items(node)[lease.pk]["volumes"] == [
        {"volume_id": volume.pk, "name": "data", "path": "/volumes/storefront/nv-data/u1"}]
    node.report(evidence=[ready(node, lease)])
    instance_stop(lease_id=lease.pk, customer=lease.customer, now=timezone.now())
    assert items(node)[lease.pk]["volumes"] == []


def test_a_lease_ordered_from_a_snapshot_restores_it_before_it_first_starts(paid_lease, enrol):
    """The new lease's `running` item carries `restore` until the node reports it
    restored; a snapshot whose key was destroyed meanwhile is asked of no node."""
    from rental.storage import lease_restore_from_set, lease_restored

    earlier = paid_lease()
    snap = ready_snapshot(earlier)
    lease = paid_lease()
    lease_restore_from_set(lease=lease, snapshot=snap, now=timezone.now())
    node = enrol(node_of(lease))
    item = items(node)[lease.pk]
    assert (item["want"], item["restore"]) == ("running", {
        "snapshot_id": snap.pk, "restic_snapshot": "4f1c2b9e", "repository": {
            "url": "s3:https://rgw.example/snap", "access_key": "AK1", "secret_key": "s3-secret",
            "password": "restic-password"}})
    assert "restore" not in items(node)[earlier.pk]
    assert lease_restored(lease_id=lease.pk, snapshot_id=snap.pk, facts={"bytes": 10**9}, now=timezone.now())
    assert "restore" not in items(node)[lease.pk]
    gone = ready_snapshot(earlier, key_destroyed_at=timezone.now())
    late = paid_lease()
    lease_restore_from_set(lease=late, snapshot=gone, now=timezone.now())
    assert node_of(late) == node.node
    assert "restore" not in items(node)[late.pk]


def test_only_a_snapshot_still_being_taken_into_a_live_repository_is_asked(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    taking(lease, repository="")                            # simulated storage (the demo): nowhere to copy to
    taking(lease, key_destroyed_at=timezone.now())          # deleted while being taken
    ready_snapshot(lease)                                   # taken already
    assert "snapshot" not in items(node)[lease.pk]


def test_the_same_desired_state_a_minute_later_has_the_same_etag(paid_lease, enrol):
    """The ETag covers everything but the clock (`generated_at`), so a steady node's
    polls are answered 304."""
    from fleet.desired import desired_document, desired_etag

    lease = paid_lease()
    node = enrol(node_of(lease)).node
    now = timezone.now()
    earlier, later = desired_document(node=node, now=now), desired_document(node=node, now=now + timedelta(minutes=1))
    assert earlier["generated_at"] != later["generated_at"]
    assert desired_etag(earlier) == desired_etag(later)
