"""Storage products on their own 30-day term, paid from the balance: ordering a network
volume or a snapshot, growing a volume pro rata, and the sweep that renews, lapses and deletes
them (ops.lifecycle runs it). The Ceph side is storage.volumes/snapshots; the
rental rows are rental.storage."""
from datetime import datetime

from django.db import transaction
from django.utils.translation import gettext as _

from billing.ledger import InsufficientBalance, account_for, ceil_div, ledger_post
from billing.models import LedgerEntry
from rental.models import Lease

from .models import StorageCharge
from .volumes import STORAGE_GRACE, STORAGE_TERM


def _storage_price(kind: str, size_tb: int) -> int:
    from inventory.models import StorageProduct

    return size_tb * StorageProduct.objects.get(kind=kind).cents_per_tb_month


def _charge_term(obj, *, kind: str, term_start: datetime, now: datetime) -> bool:
    """One 30-day term of a volume or snapshot from the balance, once per term start."""
    cents = _storage_price(kind, obj.size_tb)
    label = "network volume" if kind == "network_volume" else "snapshot"
    entry = ledger_post(customer=obj.customer, kind=LedgerEntry.Kind.ORDER, amount_cents=-cents, now=now,
                        memo=f"{label} #{obj.pk}, {obj.size_tb} TB × 30 days from {term_start:%Y-%m-%d}",
                        idempotency_key=f"{kind}:{obj.pk}:{term_start:%Y%m%dT%H%M%S}")
    if entry is not None:
        _storage_charge_site(obj, entry=entry)
    return entry is not None


def volume_order(*, customer, site, name: str, size_tb: int, now: datetime):
    """Create a network volume and pay its first 30 days from the balance (or nothing):
    the subvolume is created on the site's Ceph first (storage.volumes), so what is
    charged exists; a short balance is refused before Ceph is asked."""
    from .volumes import volume_provision

    cents = _storage_price("network_volume", size_tb)
    if account_for(customer).balance_cents < cents:
        raise InsufficientBalance(_("Your balance does not cover this volume's first 30 days."))

    def charge(volume):
        _charge_term(volume, kind="network_volume", term_start=now, now=now)

    return volume_provision(customer=customer, site=site, name=name, size_tb=size_tb, now=now, charge=charge)


def volume_grow_order(*, volume, size_tb: int, now: datetime, actor=None):
    """More TB for a volume: the extra TB for the rest of its paid term, pro rata, then
    the quota raised (storage.volumes.volume_grow)."""
    from .volumes import volume_grow

    def charge(vol, new_size):
        from inventory.models import StorageProduct

        remaining = max(0, int((vol.paid_until - now).total_seconds()))
        extra = (new_size - vol.size_tb) * StorageProduct.objects.get(kind="network_volume").cents_per_tb_month
        cents = ceil_div(extra * remaining, int(STORAGE_TERM.total_seconds()))
        entry = ledger_post(customer=vol.customer, kind=LedgerEntry.Kind.ORDER, amount_cents=-cents, now=now,
                            actor=actor, memo=f"network volume #{vol.pk}: {vol.size_tb} → {new_size} TB until "
                                              f"{vol.paid_until:%Y-%m-%d}",
                            idempotency_key=f"network_volume_grow:{vol.pk}:{new_size}:{now:%Y%m%dT%H%M%S}")
        if entry is not None:
            StorageCharge.objects.create(entry=entry, site=vol.site, kind=StorageCharge.Kind.VOLUME, object_id=vol.pk)

    return volume_grow(volume=volume, size_tb=size_tb, now=now, actor=actor, charge=charge)


def _storage_charge_site(obj, *, entry: LedgerEntry) -> None:
    """Tie a term's ledger entry to its site (storage income per site: the dashboard, the
    ledger export): a volume's site, a snapshot's lease's site."""
    from rental.models import NetworkVolume


    if isinstance(obj, NetworkVolume):
        kind, site_id = StorageCharge.Kind.VOLUME, obj.site_id
    else:
        kind, site_id = StorageCharge.Kind.SNAPSHOT, Lease.objects.values_list("site_id", flat=True).get(
            pk=obj.source_lease_id)
    StorageCharge.objects.get_or_create(entry=entry, defaults={"site_id": site_id, "kind": kind, "object_id": obj.pk})


@transaction.atomic
def snapshot_order(*, lease: Lease, size_tb: int, now: datetime, actor=None):
    """Take a snapshot of the lease's disk; `size_tb` is its repository's quota. Nothing is
    charged now: what it stores is billed in arrears per TB-month from when its copy is
    ready (storage.snapshot_usage), so `paid_until` is its creation. Refused while
    a snapshot's bill is not covered by the balance (InsufficientBalance)."""
    from .models import SnapshotMeter
    from .snapshots import snapshot_take

    if SnapshotMeter.objects.filter(snapshot__customer_id=lease.customer_id, unpaid_since__isnull=False).exists():
        raise InsufficientBalance(_("The storage of your snapshots is unpaid: top up your balance before taking "
                                    "another snapshot."))
    return snapshot_take(lease=lease, size_tb=size_tb, paid_until=now, now=now, actor=actor)


def sweep_storage(now: datetime, limit: int = 500) -> list:
    """Renew volumes whose term ended (from the balance); lapse the unpaid ones; delete those
    lapsed for 7 days; detach volumes from ended leases. (Snapshots: snapshot_usage.)"""
    from rental.lifecycle import Transition
    from rental.storage import (
        attachments_of_ended_leases_detach,
        storage_delete,
        storage_due,
        storage_expired,
        storage_extend,
        storage_lapse,
    )


    done = []
    if detached := attachments_of_ended_leases_detach(now=now, limit=limit):
        done.append(Transition(0, f"{detached} volume attachment(s) of ended leases detached"))
    for obj in storage_due(now=now, limit=limit):
        try:
            with transaction.atomic():
                _charge_term(obj, kind="network_volume", term_start=obj.paid_until, now=now)
                storage_extend(obj=obj, paid_until=obj.paid_until, new_until=obj.paid_until + STORAGE_TERM)
            done.append(Transition(0, f"{obj} renewed"))
        except InsufficientBalance:
            if storage_lapse(obj=obj, now=now):
                done.append(Transition(0, f"{obj} lapsed unpaid"))
    for obj in storage_expired(before=now - STORAGE_GRACE, limit=limit):
        if storage_delete(obj=obj, now=now, reason="unpaid for 7 days"):
            done.append(Transition(0, f"{obj} deleted"))
    return done
