"""The storage page's Ceph parts without a cluster (the demo's simulated storage): the page
says storage is simulated, a volume grows with a pro-rata charge, object storage opens with
a quota, a key's secret is shown once (never again on the page), rotate and revoke; another
customer's key is a 404. Against the real cluster: tests/storage/test_objects.py."""
import pytest
from django.urls import reverse
from django.utils import timezone

from billing.services import balance_top_up
from inventory.models import Site
from storage.charges import volume_order
from storage.models import S3Account, S3Key, StorageCharge

INDEX = "storage_mine:index"


@pytest.fixture
def alice(client, customer, catalog):
    client.force_login(customer)
    balance_top_up(customer=customer, amount_cents=100_000, now=timezone.now())
    return client


def test_simulated_notice_and_grow(alice, customer):
    page = alice.get(reverse(INDEX))
    assert page.status_code == 200 and b'id="storage-simulated"' in page.content
    volume = volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="data", size_tb=1,
                          now=timezone.now())
    assert volume.store.simulated
    grown = alice.post(reverse("storage_mine:volume_grow", args=[volume.pk]), {"size_tb": 3}, follow=True)
    assert "is now 3 TB" in grown.content.decode()
    volume.refresh_from_db()
    assert volume.size_tb == 3 and StorageCharge.objects.filter(object_id=volume.pk, kind="volume").count() == 2
    bad = alice.post(reverse("storage_mine:volume_grow", args=[volume.pk]), {"size_tb": "lots"}, follow=True)
    assert bad.status_code == 200 and "whole number of TB" in bad.content.decode()


def test_s3_key_shown_once_rotate_revoke(alice, customer, other_customer, client):
    opened = alice.post(reverse("storage_mine:s3_open"), {"site": "DFW-1", "quota_gb": 50}, follow=True)
    assert "quota 50 GB" in opened.content.decode()
    account = S3Account.objects.get(customer=customer)
    shown = alice.post(reverse("storage_mine:s3_key_new", args=[account.pk]))
    secret = shown.context["secret_key"]
    assert secret in shown.content.decode() and "s3 sync" in shown.content.decode()
    page = alice.get(reverse(INDEX)).content.decode()
    key = S3Key.objects.get(account=account)
    assert key.access_key in page and secret not in page
    rotated = alice.post(reverse("storage_mine:s3_key_rotate", args=[key.pk]))
    assert rotated.context["access_key"] != key.access_key
    key.refresh_from_db()
    assert key.revoked_at is not None
    new = S3Key.objects.get(account=account, revoked_at__isnull=True)
    client.force_login(other_customer)
    assert client.post(reverse("storage_mine:s3_key_revoke", args=[new.pk])).status_code == 404
    client.force_login(customer)
    revoked = client.post(reverse("storage_mine:s3_key_revoke", args=[new.pk]), follow=True)
    assert "revoked" in revoked.content.decode()
    assert not S3Key.objects.filter(account=account, revoked_at__isnull=True).exists()


def test_lease_page_names_a_failed_mount(alice, customer, settings):
    from billing.services import checkout_place_order
    from inventory.models import Offer, SlotAllocation
    from rental.lifecycle import sweep_provisioning
    from rental.models import Image
    from rental.storage import volume_attach
    from storage.volumes import mounts_record
    from tests.factories import KEY

    settings.HOST_AGENT_FAKE_DELAY = 0
    now = timezone.now()
    lease, _ = checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                    site=Site.objects.get(code="DFW-1"), term="week",
                                    image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                    pay_from_balance=True, now=now)
    sweep_provisioning(now)
    lease.refresh_from_db()
    volume = volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="data", size_tb=1, now=now)
    volume_attach(volume=volume, lease=lease, now=now, actor=customer)
    node = SlotAllocation.objects.filter(lease_id=lease.pk).first().slot.node
    mounts_record(node=node, lease_id=lease.pk, now=now, items=[
        {"volume_id": volume.pk, "mounted": False,
         "error": {"code": "volume_mount_failed", "detail": "data: ceph-fuse: exit 1"}}])
    page = alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert "volume_mount_failed" in page and "ceph-fuse: exit 1" in page
    mounts_record(node=node, lease_id=lease.pk, now=now, items=[{"volume_id": volume.pk, "mounted": True}])
    assert "mounted at /volumes" in alice.get(reverse("lease_detail", args=[lease.pk])).content.decode()
