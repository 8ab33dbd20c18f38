"""Snapshots through the storefront on real parts: PostgreSQL, the test
cluster's RGW, a private dockerd and the agent's real converger and restic, speaking the
real agent endpoints (`/agent/v1/desired` and the signed `/agent/v1/report`) through
Django's test client. The agent's loop runs in-process without network volumes because the
test dockerd's private mount namespace refuses their `rslave` bind (see
test_volume_end_to_end.py); everything the snapshot touches is the production path.

The customer presses "snapshot" on the storage page (no JS); the snapshot is `creating`
with its own RGW user and sealed password until the node's signed `snapshot_taken`
arrives, then ready with its stored size. A new lease ordered "from the snapshot" on
another node gets the files byte for byte before its instance starts; one whose disk is
too small is refused before anything is created. When the first node dies with its disk,
the lease moves and its new node restores the snapshot; the customer's notice names its
point in time. Deleting the snapshot purges its objects and forgets its password, recorded."""
import os
import shutil
import subprocess
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.storage.snapshot_helpers import IMAGE, SSH_KEY, NodeLoop, _exec
from tests.tools import require_tool

pytestmark = pytest.mark.django_db(transaction=True)
CHECKPOINT_MB = 64


def _restic_can_read(repo: dict) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": "/root", "RESTIC_REPOSITORY": repo["url"],
           "RESTIC_PASSWORD": repo["password"], "AWS_ACCESS_KEY_ID": repo["access_key"],
           "AWS_SECRET_ACCESS_KEY": repo["secret_key"]}
    return subprocess.run(["restic", "--no-cache", "snapshots"], env=env, capture_output=True, text=True,
                          timeout=120)


def test_snapshot_button_restore_into_new_lease_on_another_node_and_delete(
        site_cluster, ceph_cluster, customer, client, dockerd, instance_image, tmp_path, settings):
    require_tool("restic", "scripts/install-node-tools.sh")
    from billing.services import balance_top_up, checkout_place_order
    from fleet.models import NodeAgent
    from inventory.models import AuditEntry, Node, Offer, Site, SlotAllocation
    from inventory.services import node_set_draining
    from rental.failover import lease_migrate
    from rental.models import Image, Lease, LeaseEvent, LeaseState, Notification, Snapshot
    from rental.storage import StorageRefused, snapshot_repository, snapshot_restore_check

    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    settings.STORAGE_QUOTA_BYTES_PER_TB = 2**30            # the snapshot's RGW quota: 1 GiB per "TB" here
    site = Site.objects.get(code="DFW-1")
    balance_top_up(customer=customer, amount_cents=900_000, now=timezone.now())
    offer, image = Offer.objects.get(slug="rtx-3090"), Image.objects.get(slug=IMAGE)

    def order():
        lease, _invoice = checkout_place_order(customer=customer, offer=offer, site=site, term="week", image=image,
                                               ssh_public_key=SSH_KEY, pay_from_balance=True, now=timezone.now())
        node = SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True).first().slot.node
        return lease, node

    def state_of(lease):
        return Lease.objects.get(pk=lease.pk).state

    lease_a, node_a = order()
    loop_a = NodeLoop(client, node_a, tmp_path / "a", dockerd, instance_image, (22600, 22649))
    loops = [loop_a]
    try:
        loop_a.until(lambda: state_of(lease_a) == LeaseState.ACTIVE, what="lease A active")
        digest = _exec(dockerd, lease_a.pk, f"mkdir -p /workspace/run && head -c {CHECKPOINT_MB}M /dev/urandom "
                                            "> /workspace/run/ckpt.pt && sha256sum /workspace/run/ckpt.pt").split()[0]

        # The customer's button on the lease page (a plain form POST, no JS needed).
        client.force_login(customer)
        page = client.get(reverse("lease_detail", args=[lease_a.pk])).content.decode()
        assert "Snapshot this disk" in page and reverse("storage_mine:snapshot_create") in page
        response = client.post(reverse("storage_mine:snapshot_create"), {"lease": lease_a.pk, "size_tb": 1})
        assert response.status_code == 302
        snap = Snapshot.objects.get(source_lease=lease_a)
        assert snap.state == Snapshot.State.CREATING and snap.repository.startswith("s3:http")
        assert snap.sealed_secrets and snapshot_repository(snap)["password"] not in snap.sealed_secrets
        page = client.get(reverse("lease_detail", args=[lease_a.pk])).content.decode()
        assert "being taken" in page and 'hx-trigger="every 3s"' in page      # progress polled meanwhile
        client.logout()

        started = time.monotonic()
        seen = loop_a.until(lambda: Snapshot.objects.get(pk=snap.pk).state == Snapshot.State.AVAILABLE,
                            what="snapshot ready")
        snapshot_seconds = time.monotonic() - started
        snap.refresh_from_db()
        assert snap.content_bytes >= CHECKPOINT_MB * 2**20 and snap.stored_bytes >= CHECKPOINT_MB * 2**20
        assert snap.restic_snapshot and snap.ready_at and snap.progress is None and snap.error is None
        assert AuditEntry.objects.filter(action="snapshot_ready", object_id=str(snap.pk)).exists()
        client.force_login(customer)
        page = client.get(reverse("storage_mine:index")).content.decode()
        assert "stored" in page and f'id="snapshot-{snap.pk}"' in page and "ready" in page
        client.logout()
        assert "evidence[0]" in seen["answer"]["accepted"] or not seen["answer"]["refused"]
        loop_a.once()                                   # the op is no longer sent once the snapshot is ready
        assert "snapshot" not in loop_a.once()["desired"]["instances"][0]

        # Larger than the new disk: refused before anything is created or paid.
        with pytest.raises(StorageRefused, match="more than this lease"):
            snapshot_restore_check(snapshot=snap, customer=customer, site=site, disk_bytes=10 * 2**20)

        # A new lease from the snapshot, on another node (node A takes no new leases).
        node_set_draining(node=node_a, draining=True, reason="test: lease B goes elsewhere")
        client.force_login(customer)
        response = client.post(reverse("order", args=[offer.slug]), {
            "site": site.code, "term": "week", "image": image.slug, "extra_nvme_tb": 0, "network_volume_tb": 0,
            "ssh_public_key": SSH_KEY, "pay_from_balance": "on", "restore_from": snap.pk})
        assert response.status_code == 302, response.content.decode()[-2000:]
        client.logout()
        lease_b = Lease.objects.exclude(pk=lease_a.pk).get(customer=customer)
        node_b = SlotAllocation.objects.filter(lease_id=lease_b.pk, released_at__isnull=True).first().slot.node
        assert node_b.pk != node_a.pk
        loop_b = NodeLoop(client, node_b, tmp_path / "b", dockerd, instance_image, (22650, 22699))
        loops.append(loop_b)
        started = time.monotonic()
        loop_b.until(lambda: state_of(lease_b) == LeaseState.ACTIVE, what="lease B active")
        restore_seconds = time.monotonic() - started
        lease_b.refresh_from_db()
        assert lease_b.restore_from_id == snap.pk and lease_b.restored_at is not None
        assert lease_b.restored_at <= lease_b.started_at or lease_b.restored_at <= timezone.now()
        assert LeaseEvent.objects.filter(lease=lease_b, kind="snapshot_restored").exists()
        assert _exec(dockerd, lease_b.pk, "sha256sum /workspace/run/ckpt.pt").split()[0] == digest

        # Node A dies with its disk; lease A moves and its new node restores the snapshot: the
        # customer is told which point in time they got back.
        loop_a.remove_all()
        shutil.rmtree(tmp_path / "a" / "disks")
        loops.remove(loop_a)
        # Dead: no report for longer than NODE_REPORT_STALE_AFTER (a live one would copy first).
        NodeAgent.objects.filter(node=node_a).update(
            last_report_at=timezone.now() - settings.NODE_REPORT_STALE_AFTER - timedelta(minutes=1))
        moved = lease_migrate(lease_id=lease_a.pk, from_node=node_a, now=timezone.now(), reason="test: node A died")
        assert moved["restored_snapshot"] == {"snapshot": snap.pk, "taken_at": snap.ready_at.isoformat(), "fresh": False}
        target = loop_b if moved["to_node"] == node_b.name else None
        if target is None:
            target = NodeLoop(client, Node.objects.get(name=moved["to_node"]), tmp_path / "c", dockerd,
                              instance_image, (22700, 22749))
            loops.append(target)
        target.until(lambda: Lease.objects.get(pk=lease_a.pk).restored_at is not None
                     and dockerd.client().containers.list(filters={"name": f"lease-{lease_a.pk}"}),
                     what="lease A restored on its new node")
        assert _exec(dockerd, lease_a.pk, "sha256sum /workspace/run/ckpt.pt").split()[0] == digest
        notice = Notification.objects.get(lease=lease_a, kind="migrated")
        assert f"snapshot #{snap.pk}" in notice.body and f"{snap.ready_at:%Y-%m-%d %H:%M:%S}" in notice.body

        # Deleting the snapshot destroys its key: objects purged, password forgotten, recorded.
        repo = snapshot_repository(snap)
        assert _restic_can_read(repo).returncode == 0
        client.force_login(customer)
        response = client.post(reverse("storage_mine:snapshot_delete", args=[snap.pk]))
        assert response.status_code == 302
        snap.refresh_from_db()
        assert snap.state == Snapshot.State.DELETED and snap.key_destroyed_at and not snap.sealed_secrets
        destroyed = AuditEntry.objects.get(action="snapshot_key_destroyed", object_id=str(snap.pk))
        assert destroyed.detail["objects_purged"] is True and destroyed.detail["password_forgotten"] is True
        gone = _restic_can_read(repo)
        assert gone.returncode != 0
        buckets = subprocess.run(["radosgw-admin", "-c", ceph_cluster.conf, "-k", ceph_cluster.keyring,
                                  "bucket", "list"], capture_output=True, text=True, check=True).stdout
        assert snap.rgw_uid not in buckets
        print(f"\nstorefront: snapshot of {CHECKPOINT_MB} MB ready in {snapshot_seconds:.1f} s; "
              f"lease from it active in {restore_seconds:.1f} s")
    finally:
        for loop in loops:
            loop.remove_all()


def test_order_page_refuses_a_snapshot_larger_than_the_disk_before_payment(catalog, customer, client):
    """The order page's "Start from snapshot": a snapshot that does not fit the new disk is
    refused with the reason, and nothing is ordered or charged."""
    from billing.services import account_for, balance_top_up
    from inventory.models import Offer, Site
    from rental.models import Image, Lease, Snapshot

    site, offer = Site.objects.get(code="DFW-1"), Offer.objects.get(slug="rtx-3090")
    balance_top_up(customer=customer, amount_cents=900_000, now=timezone.now())
    source, _invoice = _placed(customer, offer, site)
    big = Snapshot.objects.create(customer=customer, source_lease=source, region=site.region, site=site, size_tb=100,
                                  created_at=timezone.now(), paid_until=timezone.now(), ready_at=timezone.now(),
                                  state=Snapshot.State.AVAILABLE, restic_snapshot="0123abcd",
                                  repository="s3:http://rgw.invalid/snap", content_bytes=90 * 10**12)
    before, leases = account_for(customer).balance_cents, Lease.objects.count()
    client.force_login(customer)
    page = client.get(reverse("order", args=[offer.slug])).content.decode()
    assert "Start from snapshot" in page and f'value="{big.pk}"' in page
    response = client.post(reverse("order", args=[offer.slug]), {
        "site": site.code, "term": "week", "image": Image.objects.filter(vendor="nvidia").first().slug,
        "extra_nvme_tb": 0, "network_volume_tb": 0, "ssh_public_key": SSH_KEY,
        "pay_from_balance": "on", "restore_from": big.pk})
    assert response.status_code == 400 and "more than this lease" in response.content.decode()
    assert Lease.objects.count() == leases and account_for(customer).balance_cents == before


def _placed(customer, offer, site):
    from billing.services import checkout_place_order
    from rental.models import Image

    return checkout_place_order(customer=customer, offer=offer, site=site, term="week",
                                image=Image.objects.get(slug=IMAGE), ssh_public_key=SSH_KEY, pay_from_balance=True,
                                now=timezone.now())
