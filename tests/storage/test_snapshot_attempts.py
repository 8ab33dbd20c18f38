"""Snapshots that fail, and migrations that carry the disk, through the storefront
on real parts: PostgreSQL, the test cluster's RGW, a private dockerd, the agent's real
converger and restic, speaking the real agent endpoints (test_snapshot_storefront.NodeLoop).

- An attempt that stops reporting (the agent killed mid-copy) times out after
  SNAPSHOT_STALLED_MINUTES: an audit row, the next attempt under a new op_id, which the
  restarted agent completes; the snapshot is never shown ready before that.
- A repository that refuses the node's key fails every attempt: after SNAPSHOT_ATTEMPTS the
  snapshot is `failed` with the reason on the lease page and in a notice, never ready.
- A migration off a node that still answers has it stop the instance and snapshot the disk
  first; the new node restores that copy (files written up to the stop, byte for byte) and
  the copy is destroyed once restored.
- A migration whose copy is not ready within MIGRATION_SNAPSHOT_WAIT_MINUTES moves with the
  latest ready snapshot, and the customer is told exactly which point in time they got back."""
import os
import signal
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from nodeagent.converge import Converger
from nodeagent.runtime.docker import DockerRuntime
from tests import deadlines
from tests.storage.snapshot_helpers import (
    NodeLoop,
    _active,
    _exec,
    _lease_page,
    _order,
    _snapshot_button,
)
from tests.tools import require_tool

pytestmark = pytest.mark.django_db(transaction=True)
BIG_MB = 384


@pytest.fixture
def setup(site_cluster, customer, client, settings):
    require_tool("restic", "scripts/install-node-tools.sh")
    from billing.services import balance_top_up

    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    settings.STORAGE_QUOTA_BYTES_PER_TB = 2**30            # the snapshot's RGW quota: 1 GiB per "TB" here
    settings.SNAPSHOT_RETRY_SECONDS = 0
    settings.NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE = 10_000     # the loops poll faster than a node
    balance_top_up(customer=customer, amount_cents=900_000, now=timezone.now())
    loops = []
    yield loops
    for loop in loops:
        loop.remove_all()


def _audits(snap, action):
    from inventory.models import AuditEntry

    return list(AuditEntry.objects.filter(action=action, object_id=str(snap.pk)).order_by("pk"))


def _restart(loop: NodeLoop, root) -> None:
    """The agent process again (its worker threads gone): same disks, journal, key."""
    c = loop.converger
    loop.runtime = DockerRuntime(loop.runtime.config, root / "runtime")
    loop.converger = Converger(node=c.node, runtime=loop.runtime, disks=c.disks, journal=c.journal, outbox=c.outbox,
                               key=c.key, images=c.images, public_host=c.public_host)


def _sweep(at):
    from rental.lifecycle import sweep_snapshots

    return sweep_snapshots(at)


def test_an_attempt_without_progress_times_out_and_the_next_attempt_completes(
        setup, customer, client, dockerd, instance_image, tmp_path, settings):
    from rental.models import Snapshot

    settings.SNAPSHOT_STALLED_MINUTES = 20
    lease, node = _order(customer)
    loop = NodeLoop(client, node, tmp_path / "a", dockerd, instance_image, (22800, 22849))
    setup.append(loop)
    loop.until(lambda: _active(lease), what="lease active")
    digest = _exec(dockerd, lease.pk, f"head -c {BIG_MB}M /dev/urandom > /workspace/big.bin && "
                                      "sha256sum /workspace/big.bin").split()[0]
    snap = _snapshot_button(client, customer, lease)
    assert snap.op_id == f"snap:{snap.pk}:1"
    loop.until(lambda: (Snapshot.objects.get(pk=snap.pk).progress or {}).get("bytes_done", 0) > 0,
               what="attempt 1 copying", timeout=120)
    page = _lease_page(client, customer, lease)
    assert f'id="lease-snapshot-{snap.pk}"' in page and "<progress" in page and 'hx-trigger="every 3s"' in page

    # The agent is killed mid-copy: its restic dies with it and nothing reports any more.
    job = loop.converger.jobs.get(f"snapshot:{lease.pk}")
    assert job is not None and job.op_id == snap.op_id and job.process is not None
    os.kill(job.process.pid, signal.SIGKILL)
    deadlines.wait_for(lambda: job.state != "running", 30, "the killed copy's job to end", every=0.2)
    snap.refresh_from_db()
    assert snap.state == Snapshot.State.CREATING and snap.ready_at is None

    # Not yet stalled: nothing happens; past SNAPSHOT_STALLED_MINUTES the attempt has failed
    # (its last progress report moved back 21 minutes: the node's silence since).
    assert _sweep(timezone.now()) == []
    Snapshot.objects.filter(pk=snap.pk).update(alive_at=timezone.now() - timedelta(minutes=21))
    [moved] = _sweep(timezone.now())
    assert "attempt 1 timed out" in moved.what
    snap.refresh_from_db()
    assert snap.state == Snapshot.State.CREATING and snap.attempt == 2 and snap.op_id == f"snap:{snap.pk}:2"
    assert snap.error["code"] == "snapshot_timed_out" and snap.error["attempt"] == 1
    [failed] = _audits(snap, "snapshot_attempt_failed")
    assert failed.detail["code"] == "snapshot_timed_out"
    [retry] = _audits(snap, "snapshot_retry")
    assert retry.detail["attempt"] == 2 and retry.detail["of"] == settings.SNAPSHOT_ATTEMPTS
    page = _lease_page(client, customer, lease)
    assert "Attempt 1 failed: the node reported no progress in time" in page
    assert f"Attempt 2 of {settings.SNAPSHOT_ATTEMPTS} follows" in page

    # The restarted agent is sent attempt 2 and completes it; attempt 1 never counts.
    _restart(loop, tmp_path / "a")
    seen = loop.until(lambda: Snapshot.objects.get(pk=snap.pk).state == Snapshot.State.AVAILABLE,
                      what="attempt 2 ready", timeout=300)
    snap.refresh_from_db()
    assert snap.attempt == 2 and snap.error is None and snap.content_bytes >= BIG_MB * 2**20
    [ready] = _audits(snap, "snapshot_ready")
    assert ready.detail["attempt"] == 2
    from fleet.models import Evidence
    assert list(Evidence.objects.filter(kind="snapshot_taken", lease_id=lease.pk).values_list("op_id", flat=True)) \
        == [f"snap:{snap.pk}:2"]
    assert dockerd.client().containers.get(f"lease-{lease.pk}").status == "running"
    assert _exec(dockerd, lease.pk, "sha256sum /workspace/big.bin").split()[0] == digest
    assert seen


def test_a_repository_that_refuses_the_key_fails_every_attempt_then_the_snapshot_fails(
        setup, customer, client, dockerd, instance_image, ceph_cluster, tmp_path, settings):
    from rental.models import Notification, Snapshot

    settings.SNAPSHOT_ATTEMPTS = 2
    lease, node = _order(customer)
    loop = NodeLoop(client, node, tmp_path / "r", dockerd, instance_image, (22850, 22899))
    setup.append(loop)
    loop.until(lambda: _active(lease), what="lease active")
    snap = _snapshot_button(client, customer, lease)
    # The site's RGW refuses every key of the snapshot's user (repository unreachable for the
    # node, whose key is one of its own for this op).
    subprocess.run(["radosgw-admin", "-c", ceph_cluster.conf, "-k", ceph_cluster.keyring, "user", "suspend",
                    f"--uid={snap.rgw_uid}"], check=True, capture_output=True, timeout=60)
    states = set()

    def settled():
        row = Snapshot.objects.get(pk=snap.pk)
        states.add(row.state)
        return row.state == Snapshot.State.FAILED
    loop.until(settled, what="the snapshot failed", timeout=300)
    assert Snapshot.State.AVAILABLE not in states
    snap.refresh_from_db()
    assert snap.attempt == 2 and snap.ready_at is None and not snap.restic_snapshot
    assert snap.error["code"] == "snapshot_failed" and snap.error["attempt"] == 2
    failures = _audits(snap, "snapshot_attempt_failed")
    assert [f.detail["attempt"] for f in failures] == [1, 2]
    assert all(f.detail["code"] == "snapshot_failed" and f.detail["detail"] for f in failures)
    assert len(_audits(snap, "snapshot_retry")) == 1 and len(_audits(snap, "snapshot_failed")) == 1
    page = _lease_page(client, customer, lease)
    assert "Failed after 2 attempts: the copy failed on the node" in page
    assert "Nothing was stored as a snapshot" in page
    notice = Notification.objects.get(lease=lease, kind="snapshot_failed")
    assert f"Snapshot #{snap.pk}" in notice.subject and "after 2 attempts" in notice.body
    from fleet.models import Evidence
    assert not Evidence.objects.filter(kind="snapshot_taken", lease_id=lease.pk).exists()
    # The failed op is not sent again, and the instance runs on.
    assert "snapshot" not in loop.once()["desired"]["instances"][0]
    assert dockerd.client().containers.get(f"lease-{lease.pk}").status == "running"


def _migrated_event(lease):
    from rental.models import LeaseEvent

    return LeaseEvent.objects.filter(lease=lease, kind="migrated").order_by("-pk").first()


def _target_loop(client, event, loops, dockerd, instance_image, tmp_path, ports):
    from inventory.models import Node

    for loop in loops:
        if loop.node.name == event.data["to_node"]:
            return loop
    loop = NodeLoop(client, Node.objects.get(name=event.data["to_node"]), tmp_path / "t", dockerd, instance_image,
                    ports)
    loops.append(loop)
    return loop


def test_a_migration_off_a_live_node_copies_the_disk_first_and_the_new_node_restores_it(
        setup, customer, client, dockerd, instance_image, tmp_path, settings):
    from inventory.models import AuditEntry, SlotAllocation
    from rental.failover import lease_migrate
    from rental.models import Lease, LeaseEvent, Notification, Snapshot

    lease, node_a = _order(customer)
    loop_a = NodeLoop(client, node_a, tmp_path / "a", dockerd, instance_image, (22900, 22949))
    setup.append(loop_a)
    loop_a.until(lambda: _active(lease), what="lease active")
    digest = _exec(dockerd, lease.pk, "mkdir -p /workspace/run && head -c 64M /dev/urandom > /workspace/run/ckpt.pt "
                                      "&& echo step-9000 > /workspace/run/STEP && sha256sum /workspace/run/ckpt.pt"
                   ).split()[0]
    assert not Snapshot.objects.filter(source_lease=lease).exists()     # no snapshot of the customer's own

    pending = lease_migrate(lease_id=lease.pk, from_node=node_a, now=timezone.now(), reason="test: fan failing")
    assert pending["pending"] is True and pending["from_node"] == node_a.name
    copy = Snapshot.objects.get(pk=pending["snapshot"])
    assert copy.purpose == Snapshot.Purpose.MIGRATION and copy.state == Snapshot.State.CREATING
    assert LeaseEvent.objects.filter(lease=lease, kind="migration_snapshot").exists()
    assert Notification.objects.filter(lease=lease, kind="migration_copy").exists()
    # Still on node A until the copy is ready; asking again does not take a second copy.
    assert SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True, slot__node=node_a).exists()
    again = lease_migrate(lease_id=lease.pk, from_node=node_a, now=timezone.now())
    assert again["pending"] and again["snapshot"] == copy.pk

    # Node A stops the instance, snapshots the disk; the lease moves the moment it is ready.
    loop_a.until(lambda: _migrated_event(lease) is not None, what="the move after the copy", timeout=300)
    copy.refresh_from_db()
    assert copy.state == Snapshot.State.AVAILABLE and copy.content_bytes >= 64 * 2**20
    event = _migrated_event(lease)
    assert event.data["restored_snapshot"]["snapshot"] == copy.pk and event.data["restored_snapshot"]["fresh"]
    assert "copied off the source node" in event.data["nvme"]
    # (One dockerd plays both servers here: node A drops its instance before B starts one.)
    loop_a.until(lambda: not dockerd.client().containers.list(all=True, filters={"name": f"lease-{lease.pk}"}),
                 what="node A dropped its copy")
    target = _target_loop(client, event, setup, dockerd, instance_image, tmp_path, (22950, 22999))
    assert target.node.pk != node_a.pk
    target.until(lambda: Lease.objects.get(pk=lease.pk).restored_at is not None
                 and dockerd.client().containers.list(filters={"name": f"lease-{lease.pk}", "status": "running"}),
                 what="restored and running on the new node")
    out = _exec(dockerd, lease.pk, "sha256sum /workspace/run/ckpt.pt && cat /workspace/run/STEP")
    assert out.split()[0] == digest and "step-9000" in out
    # The move's copy has done its work: deleted, its key destroyed and its objects purged.
    copy.refresh_from_db()
    assert copy.state == Snapshot.State.DELETED and copy.key_destroyed_at is not None
    destroyed = AuditEntry.objects.get(action="snapshot_key_destroyed", object_id=str(copy.pk))
    assert destroyed.detail["objects_purged"] is True
    notice = Notification.objects.get(lease=lease, kind="migrated")
    assert "copied off the old server" in notice.body and f"{copy.ready_at:%Y-%m-%d %H:%M:%S}" in notice.body
    # The old node was told to drop its copy (instance and disk key).
    instances = {i["lease_id"]: i for i in loop_a.once()["desired"]["instances"]}
    assert instances[lease.pk]["want"] == "absent" and instances[lease.pk]["disk"] in ("destroy_key", "wipe")


def test_a_migration_whose_copy_is_late_moves_with_the_latest_snapshot_and_names_its_time(
        setup, customer, client, dockerd, instance_image, tmp_path, settings):
    from rental.failover import lease_migrate
    from rental.models import Lease, Notification, Snapshot

    settings.MIGRATION_SNAPSHOT_WAIT_MINUTES = 20
    lease, node_a = _order(customer)
    loop_a = NodeLoop(client, node_a, tmp_path / "a", dockerd, instance_image, (23000, 23049))
    setup.append(loop_a)
    loop_a.until(lambda: _active(lease), what="lease active")
    _exec(dockerd, lease.pk, "echo step-100 > /workspace/STEP")
    mine = _snapshot_button(client, customer, lease)
    loop_a.until(lambda: Snapshot.objects.get(pk=mine.pk).state == Snapshot.State.AVAILABLE, what="snapshot ready")
    mine.refresh_from_db()
    _exec(dockerd, lease.pk, "echo step-200 > /workspace/STEP")     # written after the snapshot

    pending = lease_migrate(lease_id=lease.pk, from_node=node_a, now=timezone.now(), reason="test: node flaky")
    copy = Snapshot.objects.get(pk=pending["snapshot"])
    # Node A stops answering before it copies anything; the wait ends.
    setup.remove(loop_a)
    loop_a.remove_all()
    assert _sweep(timezone.now()) == []
    Snapshot.objects.filter(pk=copy.pk).update(created_at=timezone.now() - timedelta(minutes=21))   # 21 min later
    done = _sweep(timezone.now())
    assert any("move goes ahead" in t.what for t in done)
    copy.refresh_from_db()
    assert copy.state == Snapshot.State.FAILED and copy.error["code"] == "migration_wait_over"
    event = _migrated_event(lease)
    assert event.data["restored_snapshot"] == {"snapshot": mine.pk, "taken_at": mine.ready_at.isoformat(),
                                               "fresh": False}
    notice = Notification.objects.get(lease=lease, kind="migrated")
    assert f"snapshot #{mine.pk}" in notice.body and f"{mine.ready_at:%Y-%m-%d %H:%M:%S}" in notice.body
    assert "Files written after that time are not on it" in notice.body
    assert not Notification.objects.filter(lease=lease, kind="snapshot_failed").exists()   # the move's own copy
    target = _target_loop(client, event, setup, dockerd, instance_image, tmp_path, (23050, 23099))
    target.until(lambda: Lease.objects.get(pk=lease.pk).restored_at is not None
                 and dockerd.client().containers.list(filters={"name": f"lease-{lease.pk}", "status": "running"}),
                 what="restored on the new node")
    assert "step-100" in _exec(dockerd, lease.pk, "cat /workspace/STEP")      # exactly the snapshot's point in time
