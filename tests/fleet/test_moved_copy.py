"""A move leaves a copy of the lease's disk on the node it left. That copy goes the way of a
released lease's disk (fleet/desired.py): the node is told `absent` + `destroy_key`, and once
it proved the key destroyed, `absent` + `wipe` (the device back to its pool); each proof is
written on the lease with its receipt (rental.disk_keys.lease_copy_sanitized) and is part of
the lease's signed sanitization record; a failed wipe quarantines the node. The copy is
never asked to go while the move's own copy of it (the migration snapshot) is still being
taken. Before this, a moved lease's old node only ever got `destroy_key`: with the device
pool its drive was lost for good, with LVM its LV stayed.

The property at the end walks every path: a plain release, a move off a dead node, off a
node that answers (no snapshot storage; a copy that finishes; a copy whose wait runs out),
the lease ending afterwards or not, the old node acting at once or only after the lease was
wiped on its new node."""
import html
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleet.models import Evidence, NodeAgent
from inventory.models import Incident, Node
from nodeagent.records import EXIT_NO_WIPE_PROOF, EXIT_OK, exit_status, verify_record
from rental.failover import lease_migrate
from rental.models import DiskKey, LeaseEvent, LeaseState, Snapshot
from tests.fleet.helpers import snapshot_taken, taking

from .conftest import disk_wiped, key_destroyed, node_of, ready

pytestmark = pytest.mark.django_db


def item_of(node, lease) -> dict | None:
    return next((i for i in node.desired().json()["instances"] if i["lease_id"] == lease.pk), None)


def accepted(node, *records) -> bool:
    answer = node.report(evidence=list(records)).json()
    return answer == {"accepted": [f"evidence[{i}]" for i in range(len(records))], "refused": []}


def moved(paid_lease, enrol):
    """An active lease moved off its node at once (the NodeAgentDriver finds no snapshot
    storage here): (lease, the node it left, the node it is on)."""
    lease = paid_lease()
    source = enrol(node_of(lease))
    assert accepted(source, ready(source, lease))
    lease_migrate(lease_id=lease.pk, from_node=source.node, now=timezone.now(), reason="test")
    target = enrol(node_of(lease))
    assert target.node != source.node
    return lease, source, target


def test_the_old_node_destroys_the_copy_s_key_then_wipes_it_with_a_release_s_evidence(paid_lease, enrol, customer):
    lease, source, target = moved(paid_lease, enrol)
    first = item_of(source, lease)
    assert (first["want"], first["disk"]) == ("absent", "destroy_key")
    assert not accepted(source, disk_wiped(source, lease, op_id=first["op_id"]))     # not asked yet

    assert accepted(source, key_destroyed(source, lease, op_id=first["op_id"]))
    second = item_of(source, lease)
    assert (second["want"], second["disk"]) == ("absent", "wipe") and second["op_id"] == f"{lease.pk}:wipe:3"
    assert accepted(source, disk_wiped(source, lease, op_id=second["op_id"]))
    assert item_of(source, lease) is None                          # nothing left of it there
    assert (item_of(target, lease)["want"], item_of(target, lease)["disk"]) == ("running", "keep")

    # Written on the lease like a release's proofs: an event each, with the node-signed receipt.
    events = {e.kind: e for e in LeaseEvent.objects.filter(lease=lease, kind__startswith="copy_")}
    assert set(events) == {"copy_key_destroyed", "copy_wiped"}
    assert all(e.data["node"] == source.node.name and source.public_key in e.data["receipt"]
               for e in events.values())
    # The lease itself is untouched: still active on its new node, its own key live.
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE and DiskKey.objects.get(lease=lease).state == DiskKey.State.ACTIVE

    client = Client()
    client.force_login(customer)
    record = client.get(reverse("sanitization_record", args=[lease.pk])).json()
    assert [(p["kind"], p["node"], p["disk"]) for p in record["proofs"]] == [
        ("key_destroyed", source.node.name, "moved_copy"), ("disk_wiped", source.node.name, "moved_copy")]
    assert "/workspace" in record["covers"]["on_the_encrypted_disk"]
    checked = verify_record(record, node_key=[source.public_key])
    assert exit_status(checked) == EXIT_OK, checked
    page = client.get(reverse("sanitization_record_page", args=[lease.pk])).content.decode()
    assert "the copy a move to other hardware left on this server" in page and "No wipe proof yet" not in page
    # The lease's event log says it in the reader's language.
    log = html.unescape(client.get(reverse("lease_detail", args=[lease.pk])).content.decode())
    assert "Old server's copy of the disk: wiped" in log and f"disk copy on server {source.node.name} wiped" in log
    log = client.get(reverse("lease_detail", args=[lease.pk]), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "旧服务器上的磁盘副本：已擦除" in log and f"服务器 {source.node.name} 上的磁盘副本已擦除" in log


def test_until_the_wipe_is_proven_the_record_says_it_is_missing(paid_lease, enrol, customer):
    lease, source, _target = moved(paid_lease, enrol)
    assert accepted(source, key_destroyed(source, lease, op_id=item_of(source, lease)["op_id"]))
    client = Client()
    client.force_login(customer)
    record = client.get(reverse("sanitization_record", args=[lease.pk])).json()
    checked = verify_record(record, node_key=source.public_key)
    assert exit_status(checked) == EXIT_NO_WIPE_PROOF
    assert [c.kind for c in checked if c.missing] == ["disk_wiped"]
    page = client.get(reverse("sanitization_record_page", args=[lease.pk])).content.decode()
    assert f"No wipe proof yet for the disk on server {source.node.name}" in page


def test_a_failed_wipe_of_the_copy_quarantines_the_node_and_proves_nothing(paid_lease, enrol):
    lease, source, _target = moved(paid_lease, enrol)
    assert accepted(source, key_destroyed(source, lease, op_id=item_of(source, lease)["op_id"]))
    wipe = item_of(source, lease)
    assert accepted(source, disk_wiped(source, lease, op_id=wipe["op_id"], result="failed",
                                       verification={"samples": 64, "nonzero": 3, "pattern": "zero"}))
    assert Node.objects.get(pk=source.node.pk).draining
    assert Incident.objects.filter(node=source.node, ends_at__isnull=True, reason__contains="wipe failed").exists()
    assert LeaseEvent.objects.filter(lease=lease, kind="copy_wipe_failed").exists()
    assert item_of(source, lease)["disk"] == "wipe"                 # still owed
    from fleet.records import sanitization_record

    assert exit_status(verify_record(sanitization_record(lease, now=timezone.now()))) == EXIT_NO_WIPE_PROOF


def test_a_wipe_proof_of_an_older_op_does_not_count_for_a_later_copy(paid_lease, enrol):
    """A lease that came back to the node and left it again: the new copy's key is asked for
    again, whatever the node proved of the first copy."""
    lease, source, target = moved(paid_lease, enrol)
    assert accepted(source, key_destroyed(source, lease, op_id=item_of(source, lease)["op_id"]))
    assert accepted(source, disk_wiped(source, lease, op_id=item_of(source, lease)["op_id"]))
    lease_migrate(lease_id=lease.pk, from_node=target.node, now=timezone.now(), reason="back")
    assert node_of(lease) == source.node            # free slots are taken by node id: back where it was
    assert item_of(source, lease)["want"] == "running"
    lease_migrate(lease_id=lease.pk, from_node=source.node, now=timezone.now(), reason="away again")
    again = item_of(source, lease)
    assert (again["want"], again["disk"]) == ("absent", "destroy_key")


# -- every path, as a property ------------------------------------------------------------------

MOVES = ["none", "dead", "answers_no_storage", "answers_copy", "answers_copy_overdue"]


class Agent:
    """A node agent as far as disks go: it answers the snapshot op it is sent (if its copy
    is to finish), proves each disk step it is asked once per disk (its journal), and says
    what it was asked while the move's copy was still being taken."""

    def __init__(self, fake, lease, *, copy_finishes: bool):
        self.fake, self.lease, self.copy_finishes = fake, lease, copy_finishes
        self.key_done = self.wiped = False
        self.asked: list[tuple[str, str, bool]] = []      # (want, disk, the move's copy still being taken)

    def poll(self) -> None:
        item = item_of(self.fake, self.lease)
        if item is None:
            return
        copying = Snapshot.objects.filter(source_lease=self.lease, purpose=Snapshot.Purpose.MIGRATION,
                                          state=Snapshot.State.CREATING).exists()
        self.asked.append((item["want"], item["disk"], copying))
        evidence = []
        if "snapshot" in item and self.copy_finishes:
            snap = Snapshot.objects.get(pk=item["snapshot"]["snapshot_id"])
            evidence.append(snapshot_taken(self.fake, self.lease, snap))
        if item["want"] == "running" and not Evidence.objects.filter(
                node=self.fake.node, lease=self.lease, kind="instance_ready", op_id=item["op_id"]).exists():
            evidence.append(ready(self.fake, self.lease, op_id=item["op_id"]))
        if item["disk"] in ("destroy_key", "wipe") and not self.key_done:
            evidence.append(key_destroyed(self.fake, self.lease, op_id=item["op_id"]))
            self.key_done = True
        if item["disk"] == "wipe" and not self.wiped:
            evidence.append(disk_wiped(self.fake, self.lease, op_id=item["op_id"]))
            self.wiped = True
        if evidence:
            self.fake.report(evidence=evidence)


@hsettings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(move=st.sampled_from(MOVES), ends=st.booleans(), source_late=st.booleans())
def test_every_disk_a_lease_leaves_on_a_node_is_destroyed_then_wiped_and_proven(
        paid_lease, enrol, monkeypatch, settings, move, ends, source_late):
    from fleet.driver import NodeAgentDriver
    from fleet.records import sanitization_record
    from rental.lifecycle import sweep_snapshots
    from rental.services import lease_release, lease_suspend

    copies = {"take": False}
    monkeypatch.setattr(NodeAgentDriver, "migration_snapshot_take",
                        lambda self, *, lease, now: taking(lease, purpose=Snapshot.Purpose.MIGRATION)
                        if copies["take"] else None)
    with transaction.atomic():
        cache.clear()
        lease = paid_lease()
        source = Agent(enrol(node_of(lease)), lease, copy_finishes=move == "answers_copy")
        source.fake.report(evidence=[ready(source.fake, lease)])
        lease.refresh_from_db()
        assert lease.state == LeaseState.ACTIVE
        nodes = [source]
        if move != "none":
            if move == "dead":
                NodeAgent.objects.filter(node=source.fake.node).update(
                    last_report_at=timezone.now() - settings.NODE_REPORT_STALE_AFTER - timedelta(minutes=1))
            copies["take"] = move in ("answers_copy", "answers_copy_overdue")
            lease_migrate(lease_id=lease.pk, from_node=source.fake.node, now=timezone.now(), reason="test")
            if copies["take"]:
                assert node_of(lease) == source.fake.node          # it waits for its copy
                source.poll()                                      # stops; the copy finishes, or not
                if move == "answers_copy_overdue":
                    sweep_snapshots(timezone.now() + timedelta(minutes=settings.MIGRATION_SNAPSHOT_WAIT_MINUTES + 1))
            assert node_of(lease) != source.fake.node
            nodes.append(Agent(enrol(node_of(lease)), lease, copy_finishes=False))
        last = nodes[-1]
        for agent in nodes:
            if agent is not source or not source_late:
                agent.poll()
        if ends or move == "none":
            lease.refresh_from_db()
            assert lease_suspend(lease_id=lease.pk, now=lease.ends_at)
            lease.refresh_from_db()
            assert lease_release(lease_id=lease.pk, now=lease.hold_until)
            for _ in range(3):
                last.poll()
            lease.refresh_from_db()
            assert lease.state == LeaseState.WIPED
        for _ in range(3):
            for agent in nodes:
                agent.poll()

        # What each node was asked: never a disk step while the move's copy was being taken;
        # the wipe only after the key; in the end nothing left on any node it was on.
        for agent in nodes:
            disks = [disk for _want, disk, _copying in agent.asked]
            assert not any(copying and disk != "keep" for _want, disk, copying in agent.asked), agent.asked
            if "wipe" in disks:
                assert "destroy_key" in disks[:disks.index("wipe")], disks
            still_runs = agent is last and not ends and move != "none"
            assert (item_of(agent.fake, lease) or {}).get("want") == ("running" if still_runs else None), agent.asked
        if move != "none":
            assert "wipe" in [disk for _w, disk, _c in source.asked]
            assert {e.kind for e in LeaseEvent.objects.filter(lease=lease, kind__startswith="copy_")} == {
                "copy_key_destroyed", "copy_wiped"}
        record = sanitization_record(lease, now=timezone.now())
        checked = verify_record(record, node_key=[a.fake.public_key for a in nodes])
        assert exit_status(checked) == EXIT_OK, checked
        expected = ([("key_destroyed", "lease"), ("disk_wiped", "lease")] if ends or move == "none" else []) + \
                   ([("key_destroyed", "moved_copy"), ("disk_wiped", "moved_copy")] if move != "none" else [])
        assert sorted((p["kind"], p["disk"]) for p in record["proofs"]) == sorted(expected)
        transaction.set_rollback(True)
