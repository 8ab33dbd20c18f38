"""A lease that moved to another node leaves a copy of its disk here. The storefront then
sends this node `want: absent` with `disk: destroy_key`, and once the node proved the key
destroyed, `disk: wipe` (fleet/desired.py). Driven through the agent's Converger on a real
LUKS2 volume on a loop device that is the node's whole device pool: the copy's key is
destroyed and proven, then its blocks are wiped, and the device goes back to the pool, so the
next lease gets it. Before, a moved lease's copy only had its key destroyed and the
device-pool carver kept the drive assigned to it for good (the next lease: disk_unavailable).

The signed records are checked as a customer's record would be, with
nodeagent.records.verify_record (the key proof alone is reported MISSING its wipe)."""
import pytest

from nodeagent.converge import Converger
from nodeagent.interfaces import InstanceStatus, OperationFailed
from nodeagent.journal import Journal
from nodeagent.outbox import Outbox
from nodeagent.records import EXIT_NO_WIPE_PROOF, EXIT_OK, FORMAT, exit_status, verify_record
from nodeagent.signing import NodeKey, canonical_json

from .conftest import make_disks, run
from .loop_device_data import device_is_all_zero, fill_with_data

LEASE, NEXT_LEASE = 7, 8


class NoInstances:
    """The runtime of a node whose instance of the lease is already gone (the move stopped
    it): every step that the disk actions need, nothing else."""

    def status(self, lease_id):
        return InstanceStatus(lease_id=lease_id, state="absent")

    ensure_absent = ensure_stopped = status

    def lease_ids(self):
        return []

    def unpause_all(self, except_leases=()):
        return None


@pytest.fixture
def node(tmp_path, loop_device):
    disks = make_disks(tmp_path, loop_device)
    key = NodeKey.generate(tmp_path / "node.pem")
    converger = Converger(node="n-old", runtime=NoInstances(), disks=disks, journal=Journal(tmp_path / "journal.json"),
                          outbox=Outbox(tmp_path / "outbox.json"), key=key, images={}, public_host="192.0.2.10")
    return converger, key


def item(op_id: str, disk: str, want: str = "absent") -> dict:
    return {"lease_id": LEASE, "op_id": op_id, "want": want, "disk": disk}


def record_of(converger, key) -> dict:
    """What the customer would download: the node's signed records as the storefront keeps them."""
    proofs = []
    for signed in converger.outbox.pending():
        unsigned = {k: v for k, v in signed.items() if k != "signature"}
        proofs.append({"kind": signed["kind"], "node": signed["node"], "public_key": key.public_key_b64(),
                       "signed": canonical_json(unsigned).decode(), "signature": signed["signature"]})
    return {"format": FORMAT, "lease_id": LEASE, "proofs": proofs}


def test_a_moved_lease_s_copy_is_destroyed_then_wiped_and_its_device_serves_the_next_lease(node, loop_device):
    converger, key = node
    disks = converger.disks
    copy = disks.provision(LEASE, size_gb=0)
    fill_with_data(loop_device)                           # what the lease wrote (ciphertext)

    [report] = converger.converge([item(f"{LEASE}:destroy_key:3", "destroy_key")], [])
    assert (report["state"], report["error"]) == ("absent", None)
    assert [(r["kind"], r["op_id"]) for r in converger.outbox.pending()] == [("key_destroyed", f"{LEASE}:destroy_key:3")]
    assert run("cryptsetup", "isLuks", loop_device).returncode == 0      # header left, no keyslot
    # Key destroyed only: the pool's one device still belongs to the copy.
    with pytest.raises(OperationFailed) as unavailable:
        disks.provision(NEXT_LEASE, size_gb=0)
    assert unavailable.value.code == "disk_unavailable"
    checked = verify_record(record_of(converger, key), node_key=key.public_key_b64())
    assert exit_status(checked) == EXIT_NO_WIPE_PROOF and [c.kind for c in checked if c.missing] == ["disk_wiped"]

    [report] = converger.converge([item(f"{LEASE}:wipe:4", "wipe")], [])
    assert (report["state"], report["error"]) == ("absent", None)
    records = converger.outbox.pending()
    assert [(r["kind"], r["op_id"]) for r in records] == [("key_destroyed", f"{LEASE}:destroy_key:3"),
                                                         ("disk_wiped", f"{LEASE}:wipe:4")]  # the key once
    wiped = records[1]
    assert wiped["result"] == "ok" and wiped["luks_uuid"] == copy.luks_uuid
    assert wiped["verification"]["nonzero"] == 0 and wiped["verification"]["samples"] > 0
    checked = verify_record(record_of(converger, key), node_key=key.public_key_b64())
    assert exit_status(checked) == EXIT_OK and [c.kind for c in checked] == ["key_destroyed", "disk_wiped"]

    # Checked apart from the agent's word: zeros everywhere, no LUKS header, the device free.
    assert device_is_all_zero(loop_device)
    assert run("cryptsetup", "isLuks", loop_device).returncode != 0
    assert disks.carver.find(disks.runner, LEASE) is None
    converger.converge([item(f"{LEASE}:wipe:4", "wipe")], [])    # asked again: nothing redone
    assert len(converger.outbox.pending()) == 2
    nxt = disks.provision(NEXT_LEASE, size_gb=0)
    assert nxt.device == loop_device and nxt.luks_uuid != copy.luks_uuid


def test_a_lease_that_comes_back_after_its_copy_was_wiped_gets_a_new_disk_and_it_is_released_again(node,
                                                                                                 loop_device):
    """A→B→A→B: back on this node it gets a fresh disk (not "key destroyed"), and when it
    leaves again the new copy's key and wipe are proven anew (the journal's once-per-lease
    marks of the old disk do not skip them)."""
    converger, key = node
    disks = converger.disks
    first = disks.provision(LEASE, size_gb=0)
    converger.converge([item(f"{LEASE}:destroy_key:2", "destroy_key")], [])
    converger.converge([item(f"{LEASE}:wipe:3", "wipe")], [])
    assert disks.carver.find(disks.runner, LEASE) is None

    # Back: a `keep` op (stopped here: running would open the volume, and this sandbox's
    # kernel has no device-mapper; `_run` provisions the disk the same way).
    [report] = converger.converge([item(f"{LEASE}:stopped:4", "keep", want="stopped")], [])
    assert report["error"] is None
    again = disks.provision(LEASE, size_gb=0)
    assert again.device == loop_device and again.luks_uuid != first.luks_uuid and not again.key_destroyed

    converger.converge([item(f"{LEASE}:destroy_key:5", "destroy_key")], [])
    converger.converge([item(f"{LEASE}:wipe:6", "wipe")], [])
    records = converger.outbox.pending()
    assert [(r["kind"], r["op_id"]) for r in records] == [
        ("key_destroyed", f"{LEASE}:destroy_key:2"), ("disk_wiped", f"{LEASE}:wipe:3"),
        ("key_destroyed", f"{LEASE}:destroy_key:5"), ("disk_wiped", f"{LEASE}:wipe:6")]
    assert [r["luks_uuid"] for r in records] == [first.luks_uuid] * 2 + [again.luks_uuid] * 2
    assert disks.carver.find(disks.runner, LEASE) is None
    checked = verify_record(record_of(converger, key), node_key=key.public_key_b64())
    assert exit_status(checked) == EXIT_OK and len(checked) == 4


def test_no_disk_step_runs_while_a_snapshot_of_the_lease_still_copies_it(node, loop_device):
    """The storefront moves the lease only once its migration copy settled; should the node
    still run a snapshot of the lease when the destroy or wipe comes (a copy given up on),
    that snapshot is killed first and the disk is touched only once it has ended."""
    import threading

    from nodeagent.snapshots import Job

    converger, _key = node
    disks = converger.disks
    disks.provision(LEASE, size_gb=0)
    ended = threading.Event()

    def copying(job):
        while not job.cancelled:        # restic reading the disk until it is killed
            ended.wait(0.01)
        raise OperationFailed("snapshot_failed", "cancelled")

    converger.jobs.start(f"snapshot:{LEASE}", Job("snapshot", "snap:9:1"), copying)
    converger.converge([item(f"{LEASE}:wipe:4", "wipe")], [])
    assert converger.outbox.pending() == [] and disks.state.load(LEASE).key_destroyed is None
    assert converger.jobs.get(f"snapshot:{LEASE}").cancelled          # no longer asked for: killed
    for _ in range(500):
        if not converger.jobs.busy(LEASE):
            break
        ended.wait(0.01)
    converger.converge([item(f"{LEASE}:wipe:4", "wipe")], [])
    assert [r["kind"] for r in converger.outbox.pending()] == ["key_destroyed", "disk_wiped"]
    assert disks.carver.find(disks.runner, LEASE) is None
