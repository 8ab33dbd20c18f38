"""A node never keeps a snapshot key that still works (ADR 0010), on the real test cluster's
RGW: each node is sent a key made for it and its op alone (never the snapshot's own), the
same one on every poll; the key stops working — an S3 call with it is refused by RGW — once
the op is over (the copy proved), once the lease moved to another node (which gets a key of
its own), once the lease ended (the lifecycle pass's storage sweep), and with the snapshot
when it is deleted. Each removal is audited; one RGW refused is retried by the next pass."""
from datetime import timedelta

import boto3
import pytest
from botocore.client import Config
from botocore.exceptions import ClientError
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


def _s3(endpoint, repo):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=repo["access_key"],
                        aws_secret_access_key=repo["secret_key"], region_name="default",
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}))


def _works(endpoint, repo, bucket) -> bool:
    try:
        _s3(endpoint, repo).list_objects_v2(Bucket=bucket)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("InvalidAccessKeyId", "AccessDenied", "SignatureDoesNotMatch"), exc
        return False
    return True


def _order(customer, exclude_node=None):
    from billing.services import checkout_place_order
    from inventory.models import Offer, Site, SlotAllocation
    from inventory.services import node_set_draining
    from rental.models import Image

    if exclude_node is not None:
        node_set_draining(node=exclude_node, draining=True, reason="test: the next lease goes elsewhere")
    lease, _invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="DFW-1"),
        term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=SSH_KEY,
        pay_from_balance=True, now=timezone.now())
    if exclude_node is not None:
        node_set_draining(node=exclude_node, draining=False, reason="test")
    return lease, SlotAllocation.objects.get(lease_id=lease.pk, released_at__isnull=True).slot.node


def _op(node, lease_id, kind):
    from fleet.desired import desired_document

    items = [i for i in desired_document(node=node, now=timezone.now())["instances"] if i["lease_id"] == lease_id]
    return items[0].get(kind) if items else None


def test_each_node_gets_its_own_key_and_loses_it_when_its_op_ends(site_cluster, customer, settings):
    from django.db import transaction

    from billing.services import balance_top_up
    from fleet.evidence import _apply as evidence_apply
    from fleet.models import Evidence
    from inventory.models import AuditEntry, SlotAllocation
    from inventory.services import slots_allocate
    from rental.models import Lease, LeaseState
    from rental.services import lease_cancel
    from rental.storage import lease_restore_from_set, snapshot_repository
    from storage.models import SnapshotNodeKey
    from storage.snapshots import (
        snapshot_key_destroy,
        snapshot_node_keys_sync,
        snapshot_take,
    )
    from storage.sweeps import sweep_ceph

    settings.STORAGE_QUOTA_BYTES_PER_TB = 2**30
    endpoint, now = site_cluster.rgw_endpoint, timezone.now()
    balance_top_up(customer=customer, amount_cents=900_000, now=now)
    lease, node_a = _order(customer)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.ACTIVE, started_at=now, ends_at=now + timedelta(days=7))
    snap = snapshot_take(lease=Lease.objects.get(pk=lease.pk), size_tb=1, paid_until=now, now=now)
    own = snapshot_repository(snap)
    _s3(endpoint, own).create_bucket(Bucket=snap.rgw_uid)       # what restic init makes, with the store's key

    # The node taking the snapshot: a key of its own, not the snapshot's, the same on every poll.
    take = _op(node_a, lease.pk, "snapshot")["repository"]
    assert take["access_key"] != own["access_key"] and take["password"] == own["password"]
    assert _op(node_a, lease.pk, "snapshot")["repository"]["access_key"] == take["access_key"]
    assert _works(endpoint, take, snap.rgw_uid)

    # The lease moves to another node mid-copy: the old node's key stops working, the new
    # node is sent one of its own.
    SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).update(released_at=now)
    new = slots_allocate(offer=lease.offer, site=lease.site, lease_id=lease.pk, exclude_node_ids=[node_a.pk])
    node_b = new[0].node
    assert _op(node_a, lease.pk, "snapshot") is None
    assert snapshot_node_keys_sync(now=timezone.now()) == [
        f"snapshot #{snap.pk}: node {node_a.name}'s take key removed"]
    assert not _works(endpoint, take, snap.rgw_uid)
    moved = _op(node_b, lease.pk, "snapshot")["repository"]
    assert moved["access_key"] not in (take["access_key"], own["access_key"]) and _works(endpoint, moved, snap.rgw_uid)

    # The copy proved: the node's signed proof, once applied and committed, takes that key back.
    proof = Evidence(kind=Evidence.Kind.SNAPSHOT_TAKEN, op_id=snap.op_id, lease_id=lease.pk, record={
        "snapshot_id": snap.pk, "restic_snapshot": "4f1c2b9e", "bytes": 10**6, "stored_bytes": 10**6})
    with transaction.atomic():
        evidence_apply(proof, agent=None, now=timezone.now())
        assert _works(endpoint, moved, snap.rgw_uid)            # not before the commit
    assert not _works(endpoint, moved, snap.rgw_uid)
    assert _works(endpoint, own, snap.rgw_uid)                  # the store's own key is untouched

    # A new lease restores from it; the lease is cancelled before its node has restored: the
    # lifecycle pass's storage sweep takes the restore key back.
    other, node_c = _order(customer, exclude_node=node_b)
    lease_restore_from_set(lease=other, snapshot=snap, now=timezone.now())
    Lease.objects.filter(pk=other.pk).update(state=LeaseState.ACTIVE, started_at=now, ends_at=now + timedelta(days=7))
    restore = _op(node_c, other.pk, "restore")["repository"]
    assert _works(endpoint, restore, snap.rgw_uid)
    assert lease_cancel(lease_id=other.pk, now=timezone.now(), from_states=[LeaseState.ACTIVE],
                        reason="test: refunded before the restore")
    done = [t.what for t in sweep_ceph(timezone.now())]
    assert any(f"node {node_c.name}'s restore key removed" in text for text in done), done
    assert not _works(endpoint, restore, snap.rgw_uid)

    revoked = AuditEntry.objects.filter(action="snapshot_node_key_revoke", object_id=str(snap.pk))
    assert sorted(e.detail["access_key"] for e in revoked) == sorted(
        [take["access_key"], moved["access_key"], restore["access_key"]])
    assert not SnapshotNodeKey.objects.filter(revoked_at__isnull=True).exists()
    assert not SnapshotNodeKey.objects.exclude(sealed_secret="").exists()   # no secret kept once revoked

    # A key asked for again while the snapshot is deleted: gone with its RGW user.
    Lease.objects.filter(pk=lease.pk).update(restore_from=snap, restored_at=None)
    again = _op(node_b, lease.pk, "restore")["repository"]
    assert _works(endpoint, again, snap.rgw_uid)
    snapshot_key_destroy(snapshot_id=snap.pk, now=timezone.now())
    assert not _works(endpoint, again, snap.rgw_uid)
    assert not SnapshotNodeKey.objects.filter(revoked_at__isnull=True).exists()


def test_a_removal_rgw_refuses_is_kept_and_retried(site_cluster, customer, settings, monkeypatch):
    from billing.services import balance_top_up
    from rental.models import Lease, LeaseState
    from rental.services import lease_cancel
    from storage import ceph
    from storage.models import SnapshotNodeKey
    from storage.snapshots import snapshot_node_keys_sync, snapshot_take

    settings.STORAGE_QUOTA_BYTES_PER_TB = 2**30
    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=900_000, now=now)
    lease, node = _order(customer)
    Lease.objects.filter(pk=lease.pk).update(state=LeaseState.ACTIVE, started_at=now, ends_at=now + timedelta(days=7))
    snapshot_take(lease=Lease.objects.get(pk=lease.pk), size_tb=1, paid_until=now, now=now)
    key = _op(node, lease.pk, "snapshot")["repository"]
    assert lease_cancel(lease_id=lease.pk, now=now, from_states=[LeaseState.ACTIVE], reason="test")

    def refuse(self, uid, access_key):
        raise ceph.CephUnavailable("radosgw-admin: no answer")
    with monkeypatch.context() as m:
        m.setattr(ceph.Ceph, "s3_key_remove", refuse)
        assert snapshot_node_keys_sync(now=now) == []
    row = SnapshotNodeKey.objects.get(access_key=key["access_key"])
    assert row.revoked_at is None and "no answer" in row.last_error
    assert len(snapshot_node_keys_sync(now=now)) == 1
    row.refresh_from_db()
    assert row.revoked_at is not None and row.last_error == "" and row.sealed_secret == ""
