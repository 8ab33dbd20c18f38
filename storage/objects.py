"""Object storage on the site's RGW: one RGW user per customer and site, keys shown once
(RGW keeps the secret; the storefront only the access key id), rotate/revoke, a quota;
usage read from RGW by the storage sweep and billed per GB-month in arrears from the
balance (settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH), each charge a ledger entry with
its site (StorageCharge)."""
import secrets
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext as _

from inventory.audit import audit_record
from inventory.models import Site
from rental.storage import StorageRefused

from .ceph import CephError, CephUnavailable
from .models import S3Account, S3Key, StorageCharge
from .volumes import StorageUnavailable, ceph_for, cluster_of

GB = 10 ** 9
MONTH_SECONDS = 30 * 24 * 3600
BILLING_PERIOD = timedelta(days=30)
MAX_KEYS = 5


def s3_endpoint(site: Site) -> str:
    cluster = cluster_of(site)
    return cluster.rgw_endpoint if cluster else ""


def _ceph(site: Site):
    cluster = cluster_of(site)
    if cluster is None:
        if settings.STORAGE_SIMULATED:
            return None
        raise StorageUnavailable(_("Object storage is not available at %(site)s.") % {"site": site.code})
    if not cluster.rgw_endpoint:
        raise StorageUnavailable(_("Object storage is not available at %(site)s.") % {"site": site.code})
    return ceph_for(cluster)


def _down(site: Site, exc) -> StorageUnavailable:
    from .models import StorageCluster

    StorageCluster.objects.filter(site=site).update(alert=f"object storage command failed: {exc}"[:300])
    return StorageUnavailable(_("The object storage at %(site)s is not answering right now; nothing was changed "
                                "or charged. Please try again later.") % {"site": site.code})


def s3_account_open(*, customer, site: Site, quota_gb: int, now: datetime) -> S3Account:
    """The customer's RGW user at the site, with its quota (idempotent)."""
    if not 1 <= quota_gb <= 1_000_000:
        raise StorageRefused(_("The quota must be from 1 to 1,000,000 GB."))
    ceph = _ceph(site)
    account = S3Account.objects.filter(customer=customer, site=site).first()
    uid = account.uid if account else f"sf-{customer.pk}-{site.code.lower()}-{secrets.token_hex(3)}"
    if ceph is not None:
        try:
            ceph.s3_user_ensure(uid, display_name=f"customer {customer.pk}", max_bytes=quota_gb * GB)
        except (CephUnavailable, CephError) as exc:
            raise _down(site, exc) from exc
    with transaction.atomic():
        if account is None:
            account = S3Account.objects.create(customer=customer, site=site, uid=uid, quota_gb=quota_gb,
                                               simulated=ceph is None, created_at=now, metered_at=now,
                                               billed_at=now)
            audit_record(actor=customer, action="s3_account_open", obj=account,
                         detail={"uid": uid, "quota_gb": quota_gb}, at=now)
        elif account.quota_gb != quota_gb or account.state != S3Account.State.ACTIVE:
            S3Account.objects.filter(pk=account.pk).update(quota_gb=quota_gb, state=S3Account.State.ACTIVE)
            audit_record(actor=customer, action="s3_quota_set", obj=account,
                         detail={"from_gb": account.quota_gb, "to_gb": quota_gb}, at=now)
    account.refresh_from_db()
    return account


def s3_key_create(*, account: S3Account, now: datetime) -> tuple[str, str]:
    """A new key pair; the secret is returned once and stored nowhere here."""
    if account.keys.filter(revoked_at__isnull=True).count() >= MAX_KEYS:
        raise StorageRefused(_("At most %(n)d keys at once: revoke one first.") % {"n": MAX_KEYS})
    ceph = None if account.simulated else _ceph(account.site)
    if ceph is None:
        access, secret = f"SIM{secrets.token_hex(8).upper()}", secrets.token_urlsafe(30)
    else:
        try:
            access, secret = ceph.s3_key_create(account.uid)
        except (CephUnavailable, CephError) as exc:
            raise _down(account.site, exc) from exc
    with transaction.atomic():
        key = S3Key.objects.create(account=account, access_key=access, created_at=now)
        audit_record(actor=account.customer, action="s3_key_create", obj=key, detail={"access_key": access}, at=now)
    return access, secret


def s3_key_revoke(*, key: S3Key, now: datetime, actor=None) -> bool:
    if key.revoked_at is not None:
        return False
    account = key.account
    if not account.simulated:
        try:
            _ceph(account.site).s3_key_remove(account.uid, key.access_key)
        except (CephUnavailable, CephError) as exc:
            raise _down(account.site, exc) from exc
    with transaction.atomic():
        changed = S3Key.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now)
        if changed:
            audit_record(actor=actor, action="s3_key_revoke", obj=key, detail={"access_key": key.access_key}, at=now)
    return bool(changed)


def s3_key_rotate(*, key: S3Key, now: datetime, actor=None) -> tuple[str, str]:
    """A new key first, then the old one revoked: never a moment without a working key."""
    pair = s3_key_create(account=key.account, now=now)
    s3_key_revoke(key=key, now=now, actor=actor)
    return pair


@transaction.atomic
def s3_meter(*, account: S3Account, bytes_stored: int, now: datetime) -> None:
    """Accrue byte-seconds at the last reading until now, then take the new reading."""
    account = S3Account.objects.select_for_update().get(pk=account.pk)
    seconds = max(0, int((now - account.metered_at).total_seconds()))
    S3Account.objects.filter(pk=account.pk).update(
        unbilled_byte_seconds=account.unbilled_byte_seconds + Decimal(account.bytes_stored) * seconds,
        bytes_stored=bytes_stored, metered_at=now)


def s3_cents_for(byte_seconds: Decimal) -> int:
    """Whole cents of byte-seconds at the price per TB-month (rounded down; the rest carries)."""
    return int(byte_seconds * settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH // (Decimal(10 ** 12) * MONTH_SECONDS))


@transaction.atomic
def s3_bill(*, account: S3Account, now: datetime):
    """Charge the accrued usage (whole cents; the remainder is kept for the next bill).
    Idempotent per account and moment; from the balance (InsufficientBalance: the usage
    stays accrued and is charged once the balance covers it)."""
    from billing.ledger import ledger_post
    from billing.models import LedgerEntry

    account = S3Account.objects.select_for_update().get(pk=account.pk)
    cents = s3_cents_for(account.unbilled_byte_seconds)
    if cents <= 0:
        return None
    per_cent = Decimal(10 ** 12) * MONTH_SECONDS / settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH
    gb_months = account.unbilled_byte_seconds / (GB * MONTH_SECONDS)
    entry = ledger_post(customer=account.customer, kind=LedgerEntry.Kind.ORDER, amount_cents=-cents, now=now,
                        memo=f"object storage {account.site.code}: {gb_months:.3f} GB-months to {now:%Y-%m-%d %H:%M}",
                        idempotency_key=f"s3:{account.pk}:{now:%Y%m%dT%H%M%S}")
    if entry is None:
        return None
    S3Account.objects.filter(pk=account.pk).update(
        unbilled_byte_seconds=account.unbilled_byte_seconds - per_cent * cents, billed_at=now)
    StorageCharge.objects.create(entry=entry, site=account.site, kind=StorageCharge.Kind.OBJECT, object_id=account.pk)
    audit_record(actor=None, action="s3_bill", obj=account, detail={"cents": cents}, at=now)
    return entry


def s3_usage_read(*, account: S3Account) -> int:
    if account.simulated:
        return account.bytes_stored
    return _ceph(account.site).s3_bytes_stored(account.uid)
