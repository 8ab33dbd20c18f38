"""Operations money: SLA credits from downtime records, and the claims that pay them.

SLA (SPEC, second document): 99.9% availability per instance per calendar month. Below
it a credit of 3× the downtime's value, below 99% 10×, below 95% the whole month free.

- Availability = 1 − downtime / paid time, both clipped to the calendar month (UTC) and to
  the lease's paid time (from the first payment to the end of the last paid term, or the
  release). Overlapping downtime (a node and one of its GPUs) counts once.
- The downtime's value is the lease's locked price per second of its term × the downtime
  (a month-term lease: monthly price × downtime / 30 days), in cents, rounded up.
- "The whole month" is the lease's price for its paid time in that month.
- Only `down` incidents count; `degraded` ones are recorded but credited only when
  settings.SLA_COUNT_DEGRADED is true.
- Claims are filed after the month ends and within 30 days of its end; an operator approves
  (the credit is computed again from the records at that moment and posted to the
  balance under the idempotency key `sla:<lease>:<yyyy-mm>`, so a month is never credited
  twice) or declines with a reason.
"""
import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_DOWN, Decimal
from fractions import Fraction

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils.formats import date_format
from django.utils.translation import gettext as _

from inventory.audit import audit_record
from inventory.models import Downtime, Incident
from rental.models import Lease

from .models import LedgerEntry, SlaClaim
from .services import BillingError, ledger_post

SLA_TARGET = Fraction(999, 1000)
CLAIM_WINDOW = timedelta(days=30)
BANDS = [  # (availability below, multiplier of the downtime's value; None = whole month)
    (Fraction(95, 100), None),
    (Fraction(99, 100), 10),
    (SLA_TARGET, 3),
]


class ClaimRefused(BillingError):
    """The claim cannot be filed or decided as asked; the message says why."""


def month_bounds(period: date) -> tuple[datetime, datetime]:
    start = datetime(period.year, period.month, 1, tzinfo=UTC)
    days = calendar.monthrange(period.year, period.month)[1]
    return start, start + timedelta(days=days)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _union_seconds(spans: list[tuple[datetime, datetime]]) -> int:
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(spans):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += int((cur_end - cur_start).total_seconds())
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += int((cur_end - cur_start).total_seconds())
    return total


@dataclass(frozen=True)
class SlaFigures:
    lease_id: int
    period: date
    paid_seconds: int
    downtime_seconds: int
    downtime_value_cents: int
    month_value_cents: int
    multiplier: int | None  # None: whole month; 0: no credit
    credit_cents: int

    @property
    def availability(self) -> Fraction:
        if not self.paid_seconds:
            return Fraction(1)
        return 1 - Fraction(self.downtime_seconds, self.paid_seconds)

    @property
    def availability_pct(self) -> Decimal:
        return (Decimal(self.availability.numerator) * 100 / Decimal(self.availability.denominator)).quantize(
            Decimal("0.0001"), rounding=ROUND_DOWN)

    @property
    def band(self) -> str:
        if self.multiplier is None:
            return "below 95%: the whole month"
        if self.multiplier:
            return f"below {'99' if self.multiplier == 10 else '99.9'}%: {self.multiplier}× the downtime"
        return "at or above 99.9%: no credit"


def sla_figures(*, lease: Lease, period: date, now: datetime) -> SlaFigures:
    """The month's availability and credit for one lease, from its downtime records."""
    month_start, month_end = month_bounds(period)
    paid_end = min(t for t in (lease.ends_at, lease.ended_at, now, month_end) if t is not None) \
        if lease.started_at else None
    window_start = max(month_start, lease.started_at) if lease.started_at else month_start
    paid_seconds = max(0, int((paid_end - window_start).total_seconds())) if paid_end else 0
    spans = []
    if paid_seconds:
        kinds = [Incident.Kind.DOWN] + ([Incident.Kind.DEGRADED] if getattr(settings, "SLA_COUNT_DEGRADED", False)
                                        else [])
        rows = Downtime.objects.filter(lease_id=lease.pk, kind__in=kinds, starts_at__lt=paid_end).filter(
            Q(ends_at__isnull=True) | Q(ends_at__gt=window_start)).values_list("starts_at", "ends_at")
        for start, end in rows:
            start, end = max(start, window_start), min(end or paid_end, paid_end)
            if end > start:
                spans.append((start, end))
    down = _union_seconds(spans)
    term_seconds = int(lease.term_length.total_seconds())
    value = _ceil_div(lease.price_cents * down, term_seconds)
    month_value = _ceil_div(lease.price_cents * paid_seconds, term_seconds)
    availability = 1 - Fraction(down, paid_seconds) if paid_seconds else Fraction(1)
    multiplier, credit = 0, 0
    for below, mult in BANDS:
        if availability < below:
            multiplier = mult
            credit = month_value if mult is None else min(mult * value, month_value)
            break
    return SlaFigures(lease_id=lease.pk, period=date(period.year, period.month, 1), paid_seconds=paid_seconds,
                      downtime_seconds=down, downtime_value_cents=value, month_value_cents=month_value,
                      multiplier=multiplier, credit_cents=credit)


def claimable_periods(*, now: datetime) -> list[date]:
    """Months a claim can be filed for now: ended, and ended no more than 30 days ago."""
    periods, cursor = [], date(now.year, now.month, 1)
    for _step in range(3):
        cursor = (cursor - timedelta(days=1)).replace(day=1)
        if now <= month_bounds(cursor)[1] + CLAIM_WINDOW:
            periods.append(cursor)
    return periods


def _month(period: date) -> str:
    """"November 2026" / "2026年11月": the month in the active language."""
    return date_format(period, "YEAR_MONTH_FORMAT")


def sla_key(lease_id: int, period: date) -> str:
    return f"sla:{lease_id}:{period:%Y-%m}"


@transaction.atomic
def sla_claim_file(*, customer, lease: Lease, period: date, message: str, now: datetime) -> SlaClaim:
    period = date(period.year, period.month, 1)
    month_start, month_end = month_bounds(period)
    if lease.customer_id != customer.pk:
        raise ClaimRefused(_("That lease is not yours."))
    if now < month_end:
        raise ClaimRefused(_("%(month)s has not ended yet: claim once the month is over.") % {"month": _month(period)})
    if now > month_end + CLAIM_WINDOW:
        raise ClaimRefused(_("Claims for %(month)s closed on %(at)s UTC, 30 days after the month ended.")
                           % {"month": _month(period), "at": f"{(month_end + CLAIM_WINDOW):%Y-%m-%d %H:%M}"})
    if LedgerEntry.objects.filter(idempotency_key=sla_key(lease.pk, period)).exists():
        raise ClaimRefused(_("Lease #%(id)s was already credited for %(month)s.") % {"id": lease.pk, "month": _month(period)})
    figures = sla_figures(lease=lease, period=period, now=now)
    if not figures.paid_seconds:
        raise ClaimRefused(_("Lease #%(id)s had no paid time in %(month)s.") % {"id": lease.pk, "month": _month(period)})
    try:
        with transaction.atomic():
            claim = SlaClaim.objects.create(
                lease=lease, customer=customer, period=period, message=message[:4000], created_at=now,
                paid_seconds=figures.paid_seconds, downtime_seconds=figures.downtime_seconds,
                availability_pct=figures.availability_pct, credit_cents=figures.credit_cents)
    except IntegrityError:
        raise ClaimRefused(_("A claim for lease #%(id)s and %(month)s is already pending.")
                           % {"id": lease.pk, "month": _month(period)}) from None
    audit_record(actor=customer, action="sla_claim_file", obj=claim,
                 detail={"lease": lease.pk, "period": f"{period:%Y-%m}", "credit_cents": figures.credit_cents})
    return claim


def _decide(claim: SlaClaim, *, state: str, actor, reason: str, now: datetime, **fields) -> bool:
    return bool(SlaClaim.objects.filter(pk=claim.pk, state=SlaClaim.State.PENDING).update(
        state=state, decided_by=actor if getattr(actor, "pk", None) else None, decided_at=now,
        decision_reason=reason[:300], **fields))


@transaction.atomic
def sla_claim_approve(*, claim: SlaClaim, actor, now: datetime, reason: str = "") -> SlaClaim:
    """Credit the month to the balance, once. A claim for a month already credited (a second
    claim, a second approval) is declined as a duplicate and credits nothing."""
    claim = SlaClaim.objects.select_for_update().select_related("lease", "customer").get(pk=claim.pk)
    if claim.state != SlaClaim.State.PENDING:
        raise ClaimRefused(_("Claim #%(id)s was already %(state)s.") % {"id": claim.pk, "state": claim.get_state_display()})
    figures = sla_figures(lease=claim.lease, period=claim.period, now=now)
    if not figures.credit_cents:
        raise ClaimRefused(_("Claim #%(id)s: availability %(pct)s%% is at or above 99.9%%, no credit is due. "
                             "Decline it with a reason.") % {"id": claim.pk, "pct": figures.availability_pct})
    memo = (f"SLA credit lease #{claim.lease_id} {claim.period:%Y-%m}: availability {figures.availability_pct}%, "
            f"{figures.band}")
    entry = ledger_post(customer=claim.customer, kind=LedgerEntry.Kind.SLA_CREDIT, amount_cents=figures.credit_cents,
                        now=now, actor=actor, memo=memo, idempotency_key=sla_key(claim.lease_id, claim.period))
    figure_fields = {"paid_seconds": figures.paid_seconds, "downtime_seconds": figures.downtime_seconds,
                     "availability_pct": figures.availability_pct}
    if entry is None:
        first = LedgerEntry.objects.get(idempotency_key=sla_key(claim.lease_id, claim.period))
        _decide(claim, state=SlaClaim.State.DECLINED, actor=actor, now=now, credit_cents=0, **figure_fields,
                reason=f"Already credited for this month (ledger entry #{first.pk}); never credited twice.")
    else:
        _decide(claim, state=SlaClaim.State.APPROVED, actor=actor, now=now, reason=reason or memo,
                credit_cents=figures.credit_cents, ledger_entry=entry, **figure_fields)
    claim.refresh_from_db()
    audit_record(actor=actor, action=f"sla_claim_{claim.state}", obj=claim,
                 detail={"credit_cents": claim.credit_cents, "reason": claim.decision_reason})
    return claim


@transaction.atomic
def sla_claim_decline(*, claim: SlaClaim, actor, reason: str, now: datetime) -> SlaClaim:
    if not reason.strip():
        raise ClaimRefused(_("Declining a claim needs a reason the customer will see."))
    if not _decide(claim, state=SlaClaim.State.DECLINED, actor=actor, reason=reason, now=now):
        raise ClaimRefused(_("Claim #%(id)s was already decided.") % {"id": claim.pk})
    claim.refresh_from_db()
    audit_record(actor=actor, action="sla_claim_declined", obj=claim, detail={"reason": reason[:300]})
    return claim


# --- storage products on their own term, and egress ------------------------------------------

STORAGE_TERM = timedelta(days=30)
STORAGE_GRACE = timedelta(days=7)


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
    the subvolume is created on the site's Ceph first (billing.storage.volumes), so what is
    charged exists; a short balance is refused before Ceph is asked."""
    from .services import InsufficientBalance, account_for
    from .storage.volumes import volume_provision

    cents = _storage_price("network_volume", size_tb)
    if account_for(customer).balance_cents < cents:
        raise InsufficientBalance(_("Your balance does not cover this volume's first 30 days."))

    def charge(volume):
        _charge_term(volume, kind="network_volume", term_start=now, now=now)

    return volume_provision(customer=customer, site=site, name=name, size_tb=size_tb, now=now, charge=charge)


def volume_grow_order(*, volume, size_tb: int, now: datetime, actor=None):
    """More TB for a volume: the extra TB for the rest of its paid term, pro rata, then
    the quota raised (billing.storage.volumes.volume_grow)."""
    from .storage.models import StorageCharge
    from .storage.volumes import volume_grow

    def charge(vol, new_size):
        from inventory.models import StorageProduct

        remaining = max(0, int((vol.paid_until - now).total_seconds()))
        extra = (new_size - vol.size_tb) * StorageProduct.objects.get(kind="network_volume").cents_per_tb_month
        cents = _ceil_div(extra * remaining, int(STORAGE_TERM.total_seconds()))
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

    from .storage.models import StorageCharge

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
    ready (billing.storage.snapshot_usage), so `paid_until` is its creation. Refused while
    a snapshot's bill is not covered by the balance (InsufficientBalance)."""
    from .services import InsufficientBalance
    from .storage.models import SnapshotMeter
    from .storage.snapshots import snapshot_take

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

    from .services import InsufficientBalance

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


def term_start_at(lease: Lease, at: datetime) -> datetime | None:
    """The start of the paid term `at` falls in (the last one once the lease ended)."""
    if not lease.ends_at or not lease.started_at or at < lease.started_at:
        return None
    length = lease.term_length
    if at >= lease.ends_at:  # reported after the end (suspended): the last term
        return lease.ends_at - length
    terms_back = -(-(lease.ends_at - at) // length)
    return lease.ends_at - terms_back * length


@transaction.atomic
def egress_record(*, lease_id: int, tb_used, at: datetime):
    """The host agent's cumulative egress counter for the lease's current term."""
    from .models import EgressUsage

    lease = Lease.objects.get(pk=lease_id)
    term_start = term_start_at(lease, at)
    if term_start is None:
        raise BillingError(f"Lease #{lease_id} had no paid term at {at:%Y-%m-%d %H:%M}.")
    tb = Decimal(str(tb_used)).quantize(Decimal("0.001"))
    row, created = EgressUsage.objects.select_for_update().get_or_create(
        lease=lease, term_start=term_start, defaults={"tb_used": tb, "reported_at": at})
    if created:
        audit_record(actor=None, action="egress_metering_start", obj=row, detail={"term_start": term_start.isoformat()})
    elif tb > row.tb_used:
        EgressUsage.objects.filter(pk=row.pk).update(tb_used=tb, reported_at=at)
        row.refresh_from_db()
    return row


def egress_renewal_lines(*, lease: Lease) -> list:
    """Overage not yet invoiced, as lines for the renewal invoice being created (and marked
    as invoiced in the same transaction). Included: 20 TB per instance-month, pro rata for
    a week; beyond it $4 per TB, billed per 0.01 TB (4 cents)."""
    from inventory.models import StorageProduct

    from .models import EgressUsage
    from .services import TERM_DAYS, Line

    product = StorageProduct.objects.filter(kind="egress").first()
    if product is None:
        return []
    included = Decimal(product.included_tb) * TERM_DAYS[lease.term] / 30
    unit = _ceil_div(product.cents_per_tb_month, 100)  # per 0.01 TB
    lines = []
    for row in EgressUsage.objects.select_for_update().filter(lease=lease).order_by("term_start"):
        overage = max(Decimal(0), row.tb_used - included)
        hundredths = int(((overage - row.billed_overage_tb) * 100).to_integral_value(rounding="ROUND_CEILING"))
        if hundredths <= 0:
            continue
        EgressUsage.objects.filter(pk=row.pk).update(billed_overage_tb=row.billed_overage_tb + Decimal(hundredths) / 100)
        lines.append(Line(f"Egress beyond {included.quantize(Decimal('0.01'))} TB included, term from "
                          f"{row.term_start:%Y-%m-%d}: {Decimal(hundredths) / 100} TB at "
                          f"${product.cents_per_tb_month / 100:.2f}/TB (per 0.01 TB)", hundredths, unit))
    return lines
