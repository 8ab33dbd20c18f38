"""Object storage on the real test cluster's RGW through the storefront's services: an RGW
user per customer and site with its quota, a key that works with boto3 (a directory synced
to a bucket), usage read back from RGW and billed per GB-month as a ledger entry with its
site; a revoked key stops working; the quota refuses what exceeds it."""
from datetime import timedelta

import boto3
import pytest
from botocore.client import Config
from botocore.exceptions import ClientError
from django.utils import timezone

from billing.services import balance_top_up
from inventory.models import Site
from storage.models import S3Account, StorageCharge
from storage.objects import (
    MONTH_SECONDS,
    s3_account_open,
    s3_bill,
    s3_key_create,
    s3_key_revoke,
    s3_meter,
    s3_usage_read,
)
from storage.volumes import ceph_for
from tests import deadlines

pytestmark = pytest.mark.django_db(transaction=True)


def _s3(endpoint, access, secret):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
                        region_name="default", config=Config(signature_version="s3v4",
                                                             s3={"addressing_style": "path"}))


def test_s3_user_bucket_sync_usage_billed(site_cluster, customer, tmp_path, settings):
    now = timezone.now()
    balance_top_up(customer=customer, amount_cents=10_000, now=now)
    account = s3_account_open(customer=customer, site=Site.objects.get(code="DFW-1"), quota_gb=1, now=now)
    access, secret = s3_key_create(account=account, now=now)
    s3 = _s3(site_cluster.rgw_endpoint, access, secret)

    # "aws s3 sync ./checkpoints s3://ckpt/": every file of the directory uploaded.
    src = tmp_path / "checkpoints"
    src.mkdir()
    for i in range(3):
        (src / f"step-{i}.pt").write_bytes(bytes([i]) * 1_000_000)
    s3.create_bucket(Bucket="ckpt")
    for path in sorted(src.iterdir()):
        s3.upload_file(str(path), "ckpt", f"checkpoints/{path.name}")
    listed = s3.list_objects_v2(Bucket="ckpt", Prefix="checkpoints/")
    assert sorted(o["Key"] for o in listed["Contents"]) == [f"checkpoints/step-{i}.pt" for i in range(3)]

    # Usage from RGW, metered over a (simulated) month, billed at the GB-month price.
    deadlines.wait_for(lambda: s3_usage_read(account=account) >= 3_000_000, 60, "RGW's usage statistics", every=1)
    stored = s3_usage_read(account=account)
    assert stored >= 3_000_000
    s3_meter(account=account, bytes_stored=stored, now=now)
    settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH = 1500 * 10 ** 5   # make 3 MB-months worth whole cents
    s3_meter(account=account, bytes_stored=stored, now=now + timedelta(seconds=MONTH_SECONDS))
    entry = s3_bill(account=account, now=now + timedelta(seconds=MONTH_SECONDS))
    expected = stored * settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH // 10 ** 12
    assert entry is not None and -entry.amount_cents == expected
    charge = StorageCharge.objects.get(entry=entry)
    assert charge.kind == "object" and charge.site.code == "DFW-1"
    assert s3_bill(account=account, now=now + timedelta(seconds=MONTH_SECONDS)) is None   # once

    # The quota refuses an upload beyond it (set to 4 MB through the same call as the
    # service's GB quota, so the test need not upload a gigabyte).
    ceph_for(site_cluster).s3_quota_set(account.uid, max_bytes=4_000_000)
    with pytest.raises(ClientError, match="QuotaExceeded"):
        s3.put_object(Bucket="ckpt", Key="more", Body=b"\0" * 2_000_000)

    # Revoked: the key no longer works.
    s3_key_revoke(key=account.keys.get(access_key=access), now=now)
    with pytest.raises(ClientError):
        s3.list_objects_v2(Bucket="ckpt")
    assert S3Account.objects.get(pk=account.pk).uid.startswith("sf-")
