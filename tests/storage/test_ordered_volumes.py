"""The order page's "network volume" add-on on the real test cluster: paid, it is a real
CephFS subvolume with the add-on's quota, attached to the new lease through its desired
state and shown on the lease with its real size; the storage full or down at that moment
refunds the add-on's part (nothing charged for what was not created), tells the customer
and alerts the operator. A lease that ends lets go of its volumes at once (the node's key
loses them), and the volume, paid, survives it."""
import json
import subprocess
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Account, LedgerEntry
from billing.refunds import lease_refund
from billing.services import balance_top_up, checkout_place_order, price_lines
from fleet.desired import desired_instances
from inventory.models import AuditEntry, Node, Offer, Site, SlotAllocation
from rental.lifecycle import sweep_provisioning
from rental.models import Image, Lease, NetworkVolume, Notification, VolumeAttachment
from storage.models import NodeStorageKey, OrderedVolume, StorageCluster, VolumeStore
from storage.volumes import ceph_for
from tests import deadlines

pytestmark = pytest.mark.django_db(transaction=True)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGn8m0fLkz0cTqO0Jm3f9kH0xGqYwqXxZr3c0hV0kB9S alice@laptop"
MIB = 2**20


def _order(customer, *, volume_tb: int, term: str = "week"):
    """Order an RTX 3090 at DFW-1 with the add-on, paid from the balance (which held exactly
    its price): returns (lease, invoice, the invoice's volume part)."""
    offer = Offer.objects.get(slug="rtx-3090")
    lines = price_lines(offer=offer, term=term, addons={"network_volume_tb": volume_tb})
    balance_top_up(customer=customer, amount_cents=sum(x.amount_cents for x in lines), now=timezone.now())
    lease, invoice = checkout_place_order(
        customer=customer, offer=offer, site=Site.objects.get(code="DFW-1"), term=term,
        image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
        addons={"network_volume_tb": volume_tb}, pay_from_balance=True, now=timezone.now())
    volume_line = [x for x in lines if x.description.startswith("Network volume")]
    assert len(volume_line) == 1 and volume_line[0].quantity == volume_tb
    return lease, invoice, volume_line[0].amount_cents


def _balance(customer) -> int:
    return Account.objects.get(customer=customer).balance_cents


def _node_of(lease) -> Node:
    return SlotAllocation.objects.select_related("slot__node").filter(lease_id=lease.pk).first().slot.node


def test_paid_addon_is_a_real_volume_attached_to_the_lease(site_cluster, customer, client, settings):
    """Ordered on the order page, paid from the balance."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    part = 2 * 327  # $14/TB-month for 7 of 30 days, rounded up to the cent, per TB
    balance_top_up(customer=customer, amount_cents=6500 + part, now=timezone.now())
    client.force_login(customer)
    page = client.get(reverse("order", args=["rtx-3090"])).content.decode()
    assert "Created when the order is paid and mounted in the instance at /volumes" in page
    response = client.post(reverse("order", args=["rtx-3090"]), {
        "site": "DFW-1", "term": "week", "extra_nvme_tb": "0", "network_volume_tb": "2",
        "image": "pytorch-2.5-cuda-12.4", "ssh_public_key": KEY, "pay_from_balance": "on"})
    lease = Lease.objects.get(customer=customer)
    assert response.status_code == 302 and response["Location"] == reverse("lease_detail", args=[lease.pk])
    invoice = lease.invoices.get()
    assert invoice.state == "paid" and invoice.amount_cents == 6500 + part
    ordered = OrderedVolume.objects.get(lease=lease)
    assert ordered.state == "created" and ordered.cents == part
    volume = ordered.volume
    store = VolumeStore.objects.get(volume=volume)
    info = ceph_for(site_cluster).subvolume_info(store.subvolume)
    assert int(info["bytes_quota"]) == 2 * 8 * MIB                      # the size ordered, as the quota
    assert volume.size_tb == 2 and volume.site.code == "DFW-1"
    assert volume.paid_until == ordered.settled_at + timedelta(days=7)   # the week the invoice paid
    assert VolumeAttachment.objects.filter(volume=volume, lease=lease, detached_at__isnull=True).exists()
    assert _balance(customer) == 0                                       # paid once, by the invoice
    lease.refresh_from_db()
    assert lease.price_cents == invoice.amount_cents - part             # renewals: the instance only
    assert AuditEntry.objects.filter(action="ordered_volume_created", object_id=str(ordered.pk)).exists()

    # The node's key reaches the subvolume (the caps were set at once), so the running
    # instance's desired state carries the mount at /volumes/<name>.
    node = _node_of(lease)
    key = NodeStorageKey.objects.get(node=node)
    assert key.granted == [store.subvolume]
    caps = ceph_for(site_cluster).auth_caps(key.auth_id)
    assert store.path in json.dumps(caps)
    sweep_provisioning(timezone.now())
    mine = [i for i in desired_instances(node=node, now=timezone.now()) if i["lease_id"] == lease.pk][0]
    assert mine["volumes"] == [{"volume_id": volume.pk, "name": f"lease-{lease.pk}", "path": store.path}]

    # The lease page shows the volume with its real size, not "network volume 0 TB".
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert f"lease-{lease.pk} (2 TB)" in page and "network volume 0 TB" not in page

    # Refunded within the window: the lease is cancelled and lets go of the volume now (not
    # at the next pass), the node's key loses it; the volume is the customer's, paid for
    # its week, so its part is not refunded and it survives.
    refunded = lease_refund(lease=Lease.objects.get(pk=lease.pk), actor=customer)
    assert refunded == invoice.amount_cents - part and _balance(customer) == invoice.amount_cents - part
    assert not VolumeAttachment.objects.filter(volume=volume, detached_at__isnull=True).exists()
    assert NodeStorageKey.objects.get(node=node).granted == []
    assert store.path not in json.dumps(ceph_for(site_cluster).auth_caps(key.auth_id))
    assert NetworkVolume.objects.get(pk=volume.pk).state == "active"
    assert ceph_for(site_cluster).subvolume_info(store.subvolume) is not None


def _wait_health(ceph_cluster, check: str, *, present: bool, timeout: float = 60) -> None:
    """Until Ceph's health does (or no longer does) carry `check`, within `timeout` unloaded seconds."""
    deadlines.wait_for(lambda: (check in (ceph_cluster.ceph("health").get("checks") or {})) == present, timeout,
                       f"Ceph health {'to raise' if present else 'to clear'} {check}", every=1)


@pytest.fixture
def full_cluster(site_cluster, ceph_cluster):
    """The volumes' data pool at its quota (POOL_FULL): Ceph refuses new data there.
    The quota is lifted again after the test."""
    def rados(*args):
        subprocess.run(["rados", "-c", ceph_cluster.conf, "-k", ceph_cluster.keyring, "-p", "cephfs_data", *args],
                       check=True, capture_output=True, timeout=60)

    rados("put", "quota-filler", "/etc/hostname")
    ceph_cluster.ceph("osd", "pool", "set-quota", "cephfs_data", "max_objects", "1")
    try:
        _wait_health(ceph_cluster, "POOL_FULL", present=True)
        yield site_cluster
    finally:
        ceph_cluster.ceph("osd", "pool", "set-quota", "cephfs_data", "max_objects", "0")
        _wait_health(ceph_cluster, "POOL_FULL", present=False)
        rados("rm", "quota-filler")


def _assert_refunded(customer, lease, invoice, part, cluster, subvolumes_before):
    ordered = OrderedVolume.objects.get(lease=lease)
    assert ordered.state == "refunded" and ordered.volume is None
    assert not NetworkVolume.objects.exists()
    assert set(ceph_for(cluster).subvolume_names()) == subvolumes_before        # nothing created
    refund = LedgerEntry.objects.get(idempotency_key=f"ordered_volume:{lease.pk}")
    assert refund.kind == "refund" and refund.amount_cents == part and refund.invoice_id == invoice.pk
    assert _balance(customer) == part                                             # the add-on came back
    invoice.refresh_from_db()
    assert invoice.refunded_cents == part
    lease.refresh_from_db()
    assert lease.price_cents == invoice.amount_cents - part                      # and is not renewed
    assert AuditEntry.objects.filter(action="ordered_volume_refunded", object_id=str(ordered.pk)).exists()
    note = Notification.objects.get(lease=lease, kind="volume_not_created")
    assert "could not create the 1 TB network volume" in note.body and "$3.27" in note.body
    return ordered


def test_cluster_full_at_payment_refunds_the_addon_and_alerts(full_cluster, customer, client):
    before = set(ceph_for(full_cluster).subvolume_names())
    lease, invoice, part = _order(customer, volume_tb=1)
    _assert_refunded(customer, lease, invoice, part, full_cluster, before)
    assert lease.state == "provisioning"                               # the instance goes on
    assert "full" in StorageCluster.objects.get(pk=full_cluster.pk).alert  # the operator's alert

    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert "could not be created" in page and "$3.27 went back to your balance" in page


def test_cluster_down_at_payment_refunds_the_addon(site_cluster, customer):
    before = set(ceph_for(site_cluster).subvolume_names())
    StorageCluster.objects.filter(pk=site_cluster.pk).update(mon_host="127.0.0.1:9", checked_at=None)
    lease, invoice, part = _order(customer, volume_tb=1)
    StorageCluster.objects.filter(pk=site_cluster.pk).update(mon_host=site_cluster.mon_host)
    _assert_refunded(customer, lease, invoice, part, site_cluster, before)
    assert "unreachable" in StorageCluster.objects.get(pk=site_cluster.pk).alert
