"""The ledger is the truth for revenue. What a month earned is

* what customers **spent from their balance** — every debit of the ledger whatever it buys
  (orders, renewals, storage paid from the balance, any charge a later change adds), except
  taking back a reversed payment (``clawback``: a debt, not a sale) and an operator's
  correction (``adjustment``);
* plus the invoices paid **from outside the balance** (a coin, or settled by hand), except
  the ones whose money went to the balance because their lease had ended (``late:<invoice>``:
  a deposit, spent — and counted — later);
* minus what was **given back** to balances: refunds and SLA credits.

Top-ups, late and excess payment credits are deposits, not revenue: they count when spent.
``entry_revenue_cents`` gives one entry's share, for the ledger export; ``paid_outside`` the
invoices paid from outside the balance, which the export lists as journal rows beside the
entries (so its revenue column sums to the dashboard's net); ``revenue_between`` the totals,
for the dashboard.

Per site: an entry belongs to the site of what it paid — a storage charge's site
(volumes, snapshots, object storage: ``StorageCharge``), else its invoice's lease's site,
else an SLA credit's lease's site. Its **storage** share is all of a storage charge, the
storage add-on lines (network volume, snapshots) of an invoice it paid, and the refund of
an add-on that could not be created (``ordered_volume:<lease>``)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import (
    CharField,
    Count,
    Exists,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Cast, Coalesce, Concat

from .models import Invoice, InvoiceLine, LedgerEntry, SlaClaim

K = LedgerEntry.Kind
#: debits that are no sale
NOT_SPENDING = (K.CLAWBACK, K.ADJUSTMENT)
#: credits that give revenue back
GIVEN_BACK = (K.REFUND, K.SLA_CREDIT)


def entry_revenue_cents(entry: LedgerEntry) -> int:
    """One ledger entry's effect on revenue (positive: earned, negative: given back)."""
    if entry.amount_cents < 0 and entry.kind not in NOT_SPENDING:
        return -entry.amount_cents
    if entry.amount_cents > 0 and entry.kind in GIVEN_BACK:
        return -entry.amount_cents
    return 0


SPENT = Q(amount_cents__lt=0) & ~Q(kind__in=NOT_SPENDING)


def revenue_between(start: datetime, end: datetime) -> dict:
    """Totals for [start, end]: ``cents`` booked (spent from balances + paid from outside),
    ``refunds_cents``, ``sla_credits_cents``, ``net_cents``, and the parts."""
    entries = LedgerEntry.objects.filter(at__gte=start, at__lte=end).aggregate(
        spent=Sum("amount_cents", filter=SPENT),
        refunds=Sum("amount_cents", filter=Q(kind=K.REFUND)), credits=Sum("amount_cents", filter=Q(kind=K.SLA_CREDIT)))
    outside = paid_outside(start, end).aggregate(cents=Sum("amount_cents"), invoices=Count("pk"))
    spent, outside_cents = -(entries["spent"] or 0), outside["cents"] or 0
    refunds, credits = entries["refunds"] or 0, entries["credits"] or 0
    invoices = Invoice.objects.filter(state=Invoice.State.PAID, paid_at__gte=start, paid_at__lte=end).exclude(
        kind=Invoice.Kind.TOPUP).count()
    return {"cents": spent + outside_cents, "spent_from_balance_cents": spent, "paid_outside_cents": outside_cents,
            "invoices": invoices, "refunds_cents": refunds, "sla_credits_cents": credits,
            "net_cents": spent + outside_cents - refunds - credits}


def _late_key():
    return Concat(Value("late:"), Cast("pk", CharField()))


def paid_outside(start: datetime, end: datetime, *, end_inclusive: bool = True):
    """The invoices paid from outside the balance in [start, end] that are revenue: not
    top-ups, not paid from the balance (its debit is the revenue then), not those whose
    money went to the balance because their lease had ended (``late:<invoice>``). The one
    definition the dashboard's totals, the per-site rows and the ledger export's journal
    rows (ops.backoffice.exports) share, so they agree to the cent."""
    to_balance = LedgerEntry.objects.filter(idempotency_key=OuterRef("late_key"))
    rows = (Invoice.objects.filter(state=Invoice.State.PAID, paid_at__gte=start)
            .exclude(kind=Invoice.Kind.TOPUP).exclude(paid_via="balance")
            .alias(late_key=_late_key()).exclude(Exists(to_balance)))
    return rows.filter(paid_at__lte=end) if end_inclusive else rows.filter(paid_at__lt=end)


# --- per site, and the storage share ------------------------------------------------

#: an order invoice's storage add-on lines, as billing.services.price_lines stores them
STORAGE_LINE = r"^(Network volume|Snapshot), .+, per TB$"
ADDON_REFUND_KEY = "ordered_volume:"
PAYS_INVOICE = (K.ORDER, K.RENEWAL)


def storage_lines_cents(invoice_ref: str):
    """The storage add-on lines of the invoice `invoice_ref` points at, in cents (a subquery)."""
    lines = (InvoiceLine.objects.filter(invoice=OuterRef(invoice_ref), description__regex=STORAGE_LINE)
             .values("invoice").annotate(s=Sum("amount_cents")).values("s"))
    return Coalesce(Subquery(lines, output_field=IntegerField()), Value(0))


def entries_attributed(entries):
    """Ledger entries annotated with `site_code` and `invoice_storage_cents` (one query)."""
    sla_site = SlaClaim.objects.filter(ledger_entry=OuterRef("pk")).values("lease__site__code")[:1]
    return entries.annotate(
        site_code=Coalesce("storage_charge__site__code", "invoice__lease__site__code", Subquery(sla_site),
                           output_field=CharField()),
        storage_kind=Coalesce("storage_charge__kind", Value(""), output_field=CharField()),
        invoice_storage_cents=storage_lines_cents("invoice_id"))


def entry_storage_cents(entry: LedgerEntry) -> int:
    """The storage part of an entry's revenue share (needs `entries_attributed`)."""
    revenue = entry_revenue_cents(entry)
    if entry.storage_kind or (entry.idempotency_key or "").startswith(ADDON_REFUND_KEY):
        return revenue
    if revenue > 0 and entry.invoice_id and entry.kind in PAYS_INVOICE:
        return min(revenue, entry.invoice_storage_cents)
    return 0


@dataclass
class SiteRevenue:
    site: str                 # "" : an entry tied to no site (e.g. an operator's correction)
    booked_cents: int = 0     # spent from balances + invoices paid from outside
    storage_cents: int = 0    # of which storage (volumes, snapshots, object storage), net
    given_back_cents: int = 0  # refunds and SLA credits

    @property
    def net_cents(self) -> int:
        return self.booked_cents - self.given_back_cents


def revenue_by_site(start: datetime, end: datetime) -> list[SiteRevenue]:
    """``revenue_between``'s net revenue for [start, end], per site (two queries); the rows'
    net adds up to its ``net_cents``."""
    rows: dict[str, SiteRevenue] = defaultdict(lambda: SiteRevenue(site=""))
    counted = LedgerEntry.objects.filter(at__gte=start, at__lte=end).filter(
        SPENT | Q(amount_cents__gt=0, kind__in=GIVEN_BACK))
    for entry in entries_attributed(counted):
        row = rows[entry.site_code or ""]
        revenue = entry_revenue_cents(entry)
        if revenue > 0:
            row.booked_cents += revenue
        else:
            row.given_back_cents -= revenue
        row.storage_cents += entry_storage_cents(entry)
    outside = (paid_outside(start, end).annotate(storage=storage_lines_cents("pk"))
               .values_list("lease__site__code", "amount_cents", "storage"))
    for code, cents, storage in outside:
        row = rows[code or ""]
        row.booked_cents += cents
        row.storage_cents += storage
    for code, row in rows.items():
        row.site = code
    return sorted(rows.values(), key=lambda r: (r.site == "", r.site))
