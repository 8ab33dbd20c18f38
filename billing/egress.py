"""Egress metering (the host agent's counter per lease term) and the overage lines a
renewal invoice carries (billing.renewals.renewal_invoice_issue)."""
import functools
from datetime import datetime
from decimal import Decimal

from django.db import connection, transaction

from inventory.audit import audit_record
from rental.models import Lease

from .ledger import TERM_DAYS, BillingError, Line, ceil_div
from .models import EgressUsage


def term_start_at(lease: Lease, at: datetime) -> datetime | None:
    """The start of the paid term `at` falls in (the last one once the lease ended)."""
    if not lease.ends_at or not lease.started_at or at < lease.started_at:
        return None
    length = lease.term_length
    if at >= lease.ends_at:  # reported after the end (suspended): the last term
        return lease.ends_at - length
    terms_back = -(-(lease.ends_at - at) // length)
    return lease.ends_at - terms_back * length


def egress_tb(tb_used) -> Decimal:
    """TB as EgressUsage stores it: to the 0.001 TB (1 GB)."""
    return Decimal(str(tb_used)).quantize(Decimal("0.001"))


def egress_record(*, lease_id: int, tb_used, at: datetime, lease: Lease | None = None) -> None:
    """The host agent's cumulative egress counter for the lease's current term. `lease`: the
    lease's row when the caller read it already (a node's report)."""
    with transaction.atomic(savepoint=False):
        lease = lease if lease is not None and lease.pk == lease_id else Lease.objects.get(pk=lease_id)
        term_start = term_start_at(lease, at)
        if term_start is None:
            raise BillingError(f"Lease #{lease_id} had no paid term at {at:%Y-%m-%d %H:%M}.")
        tb = egress_tb(tb_used)
        # The term's row grows (one statement, the usual case), else it is made or stays.
        if _usage_grow(lease.pk, term_start, tb, at):
            return
        row, created = EgressUsage.objects.select_for_update().get_or_create(
            lease=lease, term_start=term_start, defaults={"tb_used": tb, "reported_at": at})
        if created:
            audit_record(actor=None, action="egress_metering_start", obj=row,
                         detail={"term_start": term_start.isoformat()})
        elif tb > row.tb_used:             # grown since the UPDATE above found it
            EgressUsage.objects.filter(pk=row.pk).update(tb_used=tb, reported_at=at)


@functools.cache
def _usage_grow_sql() -> str:
    def column(name: str) -> str:
        return connection.ops.quote_name(EgressUsage._meta.get_field(name).column)
    return (f"UPDATE {connection.ops.quote_name(EgressUsage._meta.db_table)} SET {column('tb_used')} = %s, "
            f"{column('reported_at')} = %s WHERE {column('lease')} = %s AND {column('term_start')} = %s "
            f"AND {column('tb_used')} < %s")


def _usage_grow(lease_id: int, term_start: datetime, tb: Decimal, at: datetime) -> bool:
    """EgressUsage.objects.filter(lease, term_start, tb_used__lt=tb).update(tb_used=tb,
    reported_at=at), as one statement whose text is composed once (a node's
    report meters egress; compiling this through the ORM was a third of its flush)."""
    field = EgressUsage._meta.get_field("tb_used")
    amount = connection.ops.adapt_decimalfield_value(tb, field.max_digits, field.decimal_places)
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_usage_grow_sql(), [amount, adapt(at), lease_id, adapt(term_start), amount])
        return cursor.rowcount > 0


def egress_renewal_lines(*, lease: Lease) -> list:
    """Overage not yet invoiced, as lines for the renewal invoice being created (and marked
    as invoiced in the same transaction). Included: 20 TB per instance-month, pro rata for
    a week; beyond it $4 per TB, billed per 0.01 TB (4 cents). One lease of `egress_overage`."""
    overage = egress_overage([lease]).get(lease.pk, [])
    egress_overage_mark(overage)
    return [line for _, _, line in overage]


def egress_overage(leases: list[Lease]) -> dict[int, list[tuple[int, Decimal, Line]]]:
    """The overage lines of a batch of renewals, {lease id: [(usage row id, overage billed
    after it, line)]}, read under the usage rows' locks; `egress_overage_mark` records them as
    invoiced once their invoice exists (only the renewals invoiced now: a term invoiced before
    keeps its overage for the next)."""
    from inventory.models import StorageProduct

    product = StorageProduct.objects.filter(kind="egress").first()
    if product is None or not leases:
        return {}
    unit = ceil_div(product.cents_per_tb_month, 100)  # per 0.01 TB
    terms = {lease.pk: lease.term for lease in leases}
    out: dict[int, list] = {}
    rows = EgressUsage.objects.select_for_update().filter(lease_id__in=list(terms)).order_by("lease_id", "term_start")
    for row in rows:
        included = Decimal(product.included_tb) * TERM_DAYS[terms[row.lease_id]] / 30
        overage = max(Decimal(0), row.tb_used - included)
        hundredths = int(((overage - row.billed_overage_tb) * 100).to_integral_value(rounding="ROUND_CEILING"))
        if hundredths <= 0:
            continue
        line = Line(f"Egress beyond {included.quantize(Decimal('0.01'))} TB included, term from "
                    f"{row.term_start:%Y-%m-%d}: {Decimal(hundredths) / 100} TB at "
                    f"${product.cents_per_tb_month / 100:.2f}/TB (per 0.01 TB)", hundredths, unit)
        out.setdefault(row.lease_id, []).append((row.pk, row.billed_overage_tb + Decimal(hundredths) / 100, line))
    return out


def egress_overage_mark(overage: list[tuple[int, Decimal, Line]]) -> None:
    for row_id, billed, _line in overage:
        EgressUsage.objects.filter(pk=row_id).update(billed_overage_tb=billed)


def egress_term_use(lease: Lease, now: datetime) -> dict | None:
    """The current term's egress against its included allowance (20 TB per instance-month,
    pro rata for a shorter term), for the lease page and the metrics API: {"term_start",
    "tb_used", "included_tb", "over_tb", "percent"}; None outside a paid term."""
    from inventory.models import StorageProduct

    term_start = term_start_at(lease, now)
    if term_start is None:
        return None
    product = StorageProduct.objects.filter(kind="egress").first()
    included = (Decimal(product.included_tb) * TERM_DAYS[lease.term] / 30 if product else Decimal(0)).quantize(
        Decimal("0.01"))
    used = EgressUsage.objects.filter(lease=lease, term_start=term_start).values_list("tb_used", flat=True).first()
    used = used if used is not None else Decimal("0.000")
    return {"term_start": term_start, "tb_used": used, "included_tb": included,
            "over_tb": max(Decimal(0), used - included),
            "percent": min(100, int(used * 100 / included)) if included else 0}
