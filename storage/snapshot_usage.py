"""Snapshots billed by what they store: the snapshot price per TB-month
(StorageProduct "snapshot", $6 in the catalog) on the snapshot's deduplicated, compressed
size (`Snapshot.stored_bytes`, measured by restic on the node), for each second it exists —
from the moment its copy is proved ready until it is deleted — billed in arrears from the
balance every 30 days, the way object storage is (storage.objects).

- Periods are fixed: [billed_until, billed_until + 30 days), and a deleted snapshot's last,
  shorter period up to its deletion, billed at the next pass. A TB is 10^12 bytes, a month
  30 days.
- Rounding: the cents of a period are the whole cents of the snapshot's usage so far minus
  the cents billed so far — rounded down on the running total, so no period is charged a
  fraction of a cent that was not used and the fractions carry to the next period; the
  total is the exact amount rounded down (at most one cent under it).
- Each period is one SnapshotUsageCharge row (unique per snapshot and period start) with
  its ledger entry, a StorageCharge tying the entry to the snapshot's site (the dashboard's
  storage revenue, the ledger export) and an audit row; the meter row is locked while a
  period is billed, so re-running the job — or two workers at once — never bills twice.
- A bill the balance does not cover leaves the period unbilled (tried again at every pass)
  and lapses the snapshot; covered within STORAGE_GRACE it is available again, else it is
  deleted (its objects purged) and what it used until then is still billed when the balance
  allows.
- Snapshots that were paid for a 30-day term when taken (before this) accrue from the end
  of that term: nothing is billed twice. A snapshot on simulated storage (demo) stores
  nothing (no stored_bytes) and costs nothing."""
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Q

from inventory.audit import audit_record
from inventory.models import StorageProduct
from rental.lifecycle import Transition
from rental.models import Snapshot

from .models import SnapshotMeter, SnapshotUsageCharge, StorageCharge

TB = 10 ** 12
MONTH_SECONDS = 30 * 24 * 3600
BILLING_PERIOD = timedelta(days=30)


def snapshot_cents_per_tb_month() -> int:
    """The catalog's price (StorageProduct "snapshot"); never a copy of it."""
    return StorageProduct.objects.get(kind=StorageProduct.Kind.SNAPSHOT).cents_per_tb_month


def snapshot_cents_for(byte_seconds: Decimal, cents_per_tb_month: int) -> int:
    """Whole cents of `byte_seconds` at the price (rounded down)."""
    return int(Decimal(byte_seconds) * cents_per_tb_month // (Decimal(TB) * MONTH_SECONDS))


def snapshot_ended_at(snap: Snapshot) -> datetime | None:
    """When the snapshot stopped being stored: deleted (or its key destroyed)."""
    if snap.state == Snapshot.State.DELETED:
        return snap.deleted_at or snap.key_destroyed_at
    return snap.key_destroyed_at


def _site_id(snap: Snapshot) -> int:
    return snap.site_id or snap.source_lease.site_id


def snapshot_meter(snap: Snapshot) -> SnapshotMeter | None:
    """The snapshot's meter, made when its copy is ready (None before)."""
    if snap.ready_at is None:
        return None
    start = max(snap.ready_at, snap.paid_until or snap.ready_at)  # a term paid when taken (before) is not billed again
    meter, _created = SnapshotMeter.objects.get_or_create(snapshot=snap,
                                                          defaults={"accrues_from": start, "billed_until": start})
    return meter


@dataclass
class Billed:
    charges: list
    refused: bool = False   # the balance did not cover a period


def snapshot_bill(*, snapshot: Snapshot, now: datetime) -> Billed:
    """Bill every period of the snapshot that has ended by `now` (idempotent)."""
    from billing.ledger import InsufficientBalance

    done = Billed(charges=[])
    if snapshot_meter(snapshot) is None:
        return done
    price = snapshot_cents_per_tb_month()
    while True:
        try:
            charge = _bill_one_period(snapshot_id=snapshot.pk, now=now, price=price)
        except InsufficientBalance:
            done.refused = True
            _unpaid(snapshot_id=snapshot.pk, now=now)
            return done
        if charge is None:
            return done
        done.charges.append(charge)


@transaction.atomic
def _bill_one_period(*, snapshot_id: int, now: datetime, price: int) -> SnapshotUsageCharge | None:
    from billing.ledger import ledger_post
    from billing.models import LedgerEntry

    meter = SnapshotMeter.objects.select_for_update().get(snapshot_id=snapshot_id)
    snap = Snapshot.objects.select_related("source_lease").get(pk=snapshot_id)
    if meter.closed_at is not None:
        return None
    ended = snapshot_ended_at(snap)
    start = meter.billed_until
    end = start + BILLING_PERIOD
    if ended is not None and ended < end:
        end = max(ended, start)
    elif end > now:
        return None  # the current period has not ended yet
    if end > now:
        return None
    stored = snap.stored_bytes or 0
    seconds = int((end - start).total_seconds())
    byte_seconds = Decimal(stored) * seconds
    total = meter.billed_byte_seconds + byte_seconds
    cents = snapshot_cents_for(total, price) - meter.billed_cents
    site_id = _site_id(snap)
    entry = None
    if cents > 0:
        tb_months = byte_seconds / (Decimal(TB) * MONTH_SECONDS)
        entry = ledger_post(
            customer=snap.customer, kind=LedgerEntry.Kind.ORDER, amount_cents=-cents, now=now,
            memo=f"snapshot #{snap.pk}: {stored / TB:.3f} TB stored, {tb_months:.4f} TB-months "
                 f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}",
            idempotency_key=f"snapshot_usage:{snap.pk}:{start:%Y%m%dT%H%M%S}")
        if entry is None:  # billed already (a lost meter update cannot happen under the lock; belt and braces)
            return None
        StorageCharge.objects.create(entry=entry, site_id=site_id, kind=StorageCharge.Kind.SNAPSHOT, object_id=snap.pk)
    charge = SnapshotUsageCharge.objects.create(
        snapshot=snap, site_id=site_id, period_start=start, period_end=end, stored_bytes=stored,
        byte_seconds=byte_seconds, cents=max(0, cents), entry=entry, created_at=now)
    closed = now if ended is not None and end >= ended else None
    SnapshotMeter.objects.filter(pk=meter.pk).update(
        billed_until=end, billed_byte_seconds=total, billed_cents=meter.billed_cents + max(0, cents),
        unpaid_since=None, closed_at=closed)
    if meter.unpaid_since is not None and Snapshot.objects.filter(pk=snap.pk, state=Snapshot.State.LAPSED).update(
            state=Snapshot.State.AVAILABLE):
        audit_record(actor=None, action="snapshot_paid_again", obj=snap, detail={"unpaid_since":
                     meter.unpaid_since.isoformat()}, at=now)
    audit_record(actor=None, action="snapshot_usage_billed", obj=snap,
                 detail={"period_start": start.isoformat(), "period_end": end.isoformat(), "stored_bytes": stored,
                         "cents": max(0, cents), "entry": entry.pk if entry else None}, at=now)
    return charge


@transaction.atomic
def _unpaid(*, snapshot_id: int, now: datetime) -> None:
    from rental.storage import storage_lapse

    if SnapshotMeter.objects.filter(snapshot_id=snapshot_id, unpaid_since__isnull=True).update(unpaid_since=now):
        snap = Snapshot.objects.get(pk=snapshot_id)
        storage_lapse(obj=snap, now=now)
        audit_record(actor=None, action="snapshot_usage_unpaid", obj=snap, detail={}, at=now)


def sweep_snapshot_usage(now: datetime, limit: int = 500) -> list[Transition]:
    """Bill the snapshots' ended periods; delete the snapshots unpaid past the grace."""
    from rental.storage import storage_delete

    from .volumes import STORAGE_GRACE

    done = []
    # ready snapshots never billed yet, and the open meters; a migration's copy is the
    # operator's cost, not the customer's (deleted once the new node restored it)
    new = (Snapshot.objects.filter(ready_at__isnull=False, meter__isnull=True)
           .exclude(purpose=Snapshot.Purpose.MIGRATION).order_by("pk")[:limit])
    due = Q(meter__billed_until__lte=now - BILLING_PERIOD) | Q(state=Snapshot.State.DELETED) | Q(
        key_destroyed_at__isnull=False)
    open_ = Snapshot.objects.filter(due, meter__closed_at__isnull=True).order_by("meter__billed_until", "pk")[:limit]
    for snap in [*new, *open_]:
        billed = snapshot_bill(snapshot=snap, now=now)
        cents = sum(c.cents for c in billed.charges)
        if cents:
            done.append(Transition(0, f"snapshot #{snap.pk}: {cents} cents of storage billed"))
        if billed.refused:
            done.append(Transition(0, f"snapshot #{snap.pk}: storage not covered by the balance, kept accrued"))
    overdue = SnapshotMeter.objects.filter(unpaid_since__lte=now - STORAGE_GRACE, snapshot__state=Snapshot.State.LAPSED)
    for meter in overdue.select_related("snapshot")[:limit]:
        if storage_delete(obj=meter.snapshot, now=now, reason="storage unpaid for 7 days"):
            done.append(Transition(0, f"snapshot #{meter.snapshot_id} deleted, unpaid"))
    return done


def snapshot_charges_of(customer, limit: int = 24):
    """The customer's latest snapshot charges, for My storage."""
    return (SnapshotUsageCharge.objects.filter(snapshot__customer=customer, cents__gt=0)
            .select_related("site")[:limit])
