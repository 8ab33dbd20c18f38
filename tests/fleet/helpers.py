"""Builders the fleet tests share: desired-state snapshots being taken or ready, released
leases and their operations, evidence refused or taken. Fixtures are in conftest.py."""
from datetime import timedelta

from django.utils import timezone

from core.sealing import seal
from rental.models import Snapshot
from rental.services import lease_release, lease_suspend

from .conftest import ready, rfc3339


def taking(lease, **fields) -> Snapshot:
    """A snapshot of the lease's disk being taken (its repository created, secrets sealed)."""
    now = timezone.now()
    return Snapshot.objects.create(**{
        "customer": lease.customer, "source_lease": lease, "region": lease.site.region, "site": lease.site,
        "size_tb": 1, "state": Snapshot.State.CREATING, "created_at": now, "paid_until": now + timedelta(days=7),
        "repository": "s3:https://rgw.example/snap", "access_key": "AK1",
        "sealed_secrets": seal({"secret_key": "s3-secret", "password": "restic-password"}), **fields})


def ready_snapshot(lease, **fields) -> Snapshot:
    """A copy of the lease's disk the customer can restore (small enough for any disk)."""
    return taking(lease, state=Snapshot.State.AVAILABLE, ready_at=timezone.now(), restic_snapshot="4f1c2b9e",
                  content_bytes=10**9, **fields)


def op_of(node, lease) -> str:
    return next(i["op_id"] for i in node.desired().json()["instances"] if i["lease_id"] == lease.pk)


def released(lease, node, now):
    """Active, then suspended and released unpaid: the key destruction is requested."""
    node.report(evidence=[ready(node, lease)])
    lease.refresh_from_db()
    assert lease_suspend(lease_id=lease.pk, now=lease.ends_at)
    lease.refresh_from_db()
    assert lease_release(lease_id=lease.pk, now=lease.hold_until)
    lease.refresh_from_db()
    return lease


def refused(node, record) -> list:
    response = node.report(evidence=[record])
    assert response.status_code == 200
    assert response.json()["accepted"] == []
    return response.json()["refused"]


def snapshot_taken(node, lease, snap, op_id="", **fields):
    facts = {"snapshot_id": snap.pk, "restic_snapshot": "9c2f41ab", "files": 12, "bytes": 5 * 10**9,
             "stored_bytes": 2 * 10**9, "consistency": "paused", "paused_seconds": 1,
             "started_at": rfc3339(timezone.now()), "finished_at": rfc3339(timezone.now())}
    return node.evidence("snapshot_taken", lease, op_id or snap.op_id, **(facts | fields))
