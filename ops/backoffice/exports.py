"""CSV exports for accounting: leases (running during the period), invoices (created in
it), payments (first seen in it) and the balance ledger (every entry made in it, with its
share of revenue (``billing.revenue``: the ledger is the truth for revenue), its site and the
storage part of that share). Streamed row by row with csv.writer, amounts in
integer cents and in USD (exact, two decimals); coin amounts in base units and in coin.
Served by the admin view /admin/ops/exports/, to staff with the view permission of what
is exported. Cells are escaped against formula injection (a spreadsheet runs a cell that
starts with = + - @), so a customer's name or note cannot become a formula."""
import csv
import re
from datetime import UTC, date, datetime, time, timedelta

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import StreamingHttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from billing.models import Invoice, LedgerEntry, Payment
from billing.payments.coins.amounts import format_amount
from billing.payments.coins.base import Coin
from billing.payments.services import to_usd_cents
from billing.revenue import (
    entries_attributed,
    entry_revenue_cents,
    entry_storage_cents,
    paid_outside,
    storage_lines_cents,
)
from rental.api import usd as decimal_usd
from rental.models import Lease
from rental.permissions import ops_view


def usd(cents: int | None) -> str:
    return "" if cents is None else decimal_usd(cents)


def iso(dt: datetime | None) -> str:
    return dt.astimezone(UTC).isoformat() if dt else ""


def lease_rows(start: datetime, end: datetime):
    yield ["lease_id", "customer", "offer", "gpus", "site", "term", "state", "price_cents", "price_usd",
           "extra_nvme_tb", "created_at", "started_at", "ends_at", "ended_at"]
    leases = (Lease.objects.filter(created_at__lt=end).filter(Q(ended_at__isnull=True) | Q(ended_at__gte=start))
              .select_related("customer", "offer__gpu_model", "site").order_by("pk"))
    for x in leases.iterator(chunk_size=500):
        yield [x.pk, x.customer.username, x.offer.display_name, x.offer.gpu_count, x.site.code, x.term, x.state,
               x.price_cents, usd(x.price_cents), x.extra_nvme_tb, iso(x.created_at), iso(x.started_at),
               iso(x.ends_at), iso(x.ended_at)]


def invoice_rows(start: datetime, end: datetime):
    yield ["invoice_id", "customer", "lease_id", "site", "kind", "state", "term_start", "amount_cents", "amount_usd",
           "storage_cents", "created_at", "paid_at", "paid_via", "note"]
    invoices = (Invoice.objects.filter(created_at__gte=start, created_at__lt=end).select_related("customer", "lease__site")
                .annotate(storage_cents=storage_lines_cents("pk")).order_by("created_at", "pk"))
    for x in invoices.iterator(chunk_size=500):
        yield [x.pk, x.customer.username, x.lease_id or "", x.lease.site.code if x.lease_id else "", x.kind, x.state,
               iso(x.term_start), x.amount_cents, usd(x.amount_cents), x.storage_cents, iso(x.created_at),
               iso(x.paid_at), x.paid_via, x.note]


def payment_rows(start: datetime, end: datetime):
    yield ["payment_id", "coin", "txid", "output_index", "quote_id", "invoice_id", "customer", "state",
           "confirmations", "amount_base_units", "amount_coin", "rate_usd_per_coin", "usd_cents", "usd",
           "first_seen_at", "confirmed_at"]
    payments = (Payment.objects.filter(first_seen_at__gte=start, first_seen_at__lt=end)
                .select_related("quote__invoice__customer").order_by("first_seen_at", "pk"))
    for p in payments.iterator(chunk_size=500):
        units = int(p.amount)
        cents = to_usd_cents(units, p.quote)
        yield [p.pk, p.coin, p.txid, p.output_index, p.quote_id, p.quote.invoice_id, p.quote.invoice.customer.username,
               p.state, p.confirmations, units, format_amount(units, Coin(p.coin).decimals),
               p.quote.rate_usd_per_coin, cents, usd(cents), iso(p.first_seen_at), iso(p.confirmed_at)]


def ledger_rows(start: datetime, end: datetime):
    yield ["entry_id", "at", "customer", "site", "kind", "product", "amount_cents", "amount_usd",
           "balance_after_cents", "revenue_cents", "revenue_usd", "storage_revenue_cents", "storage_revenue_usd",
           "invoice_id", "actor", "memo", "key"]
    entries = entries_attributed(LedgerEntry.objects.filter(at__gte=start, at__lt=end)
                                 .select_related("account__customer", "actor").order_by("at", "pk"))
    for e in entries.iterator(chunk_size=500):
        revenue, storage = entry_revenue_cents(e), entry_storage_cents(e)
        yield [e.pk, iso(e.at), e.account.customer.username, e.site_code or "", e.kind, _product(e), e.amount_cents,
               usd(e.amount_cents), e.balance_after_cents, revenue, usd(revenue), storage, usd(storage),
               e.invoice_id or "", e.actor.username if e.actor_id else "", e.memo, e.idempotency_key or ""]
    yield from journal_rows(start, end)


#: The kind of a journal row: an invoice paid from outside the balance (a coin, by hand).
PAID_OUTSIDE = "paid_outside"


def journal_rows(start: datetime, end: datetime):
    """The journal beside the ledger: one row per invoice paid from outside the balance in
    the period (billing.revenue.paid_outside), with its revenue and no balance effect (its
    id is invoice:<id>, its amount and balance columns empty). Without them a store paid in
    coins showed its refunds and no sales: the export's revenue column now sums to the
    dashboard's net revenue for the same period."""
    invoices = (paid_outside(start, end, end_inclusive=False).select_related("customer", "lease__site")
                .annotate(storage_cents=storage_lines_cents("pk")).order_by("paid_at", "pk"))
    for x in invoices.iterator(chunk_size=500):
        yield [f"invoice:{x.pk}", iso(x.paid_at), x.customer.username, x.lease.site.code if x.lease_id else "",
               PAID_OUTSIDE, "invoice", "", "", "", x.amount_cents, usd(x.amount_cents), x.storage_cents,
               usd(x.storage_cents), x.pk, "", f"invoice #{x.pk} paid via {x.paid_via}", ""]


def _product(entry) -> str:
    """What the entry paid for: a storage product (volume, snapshot, object), an invoice
    (the lease and its add-ons), or nothing (deposits, corrections)."""
    if entry.storage_kind:
        return entry.storage_kind
    if (entry.idempotency_key or "").startswith("ordered_volume:"):
        return "volume"
    return "invoice" if entry.invoice_id else ""


EXPORTS = {"leases": lease_rows, "invoices": invoice_rows, "payments": payment_rows, "ledger": ledger_rows}
# Who may download what: the model's view permission (superusers have all).
EXPORT_PERMISSIONS = {"leases": "rental.view_lease", "invoices": "billing.view_invoice",
                      "payments": "billing.view_payment", "ledger": "billing.view_ledgerentry"}
EARLIEST, LATEST = date(2000, 1, 1), date(2999, 12, 31)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def csv_safe(value):
    """A text cell that a spreadsheet would run as a formula gets a leading apostrophe
    (OWASP's advice); numbers, including negative amounts like -5.00, stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_START) and not PLAIN_NUMBER.match(value):
        return "'" + value
    return value


class ExportForm(forms.Form):
    what = forms.ChoiceField(label=pgettext_lazy("CSV export", "What"), choices=[(k, k) for k in EXPORTS])
    date_from = forms.DateField(label=_("From (UTC, inclusive)"), widget=forms.DateInput(attrs={"type": "date"}))
    date_to = forms.DateField(label=_("To (UTC, inclusive)"), widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self):
        data = super().clean()
        if data.get("date_from") and data.get("date_to") and data["date_to"] < data["date_from"]:
            raise forms.ValidationError(gettext("The period ends before it starts."))
        if any(not EARLIEST <= data[d] <= LATEST for d in ("date_from", "date_to") if data.get(d)):
            raise forms.ValidationError(gettext("Dates must be between %(earliest)s and %(latest)s.")
                                        % {"earliest": EARLIEST, "latest": LATEST})
        return data


class _Echo:
    def write(self, value):
        return value


def stream_csv(rows, filename: str) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    response = StreamingHttpResponse((writer.writerow([csv_safe(cell) for cell in row]) for row in rows),
                                     content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@ops_view(read=tuple(EXPORT_PERMISSIONS.values()))
def export_view(request):
    form = ExportForm(request.GET or None)
    if request.GET and form.is_valid():
        d = form.cleaned_data
        if not request.user.has_perm(EXPORT_PERMISSIONS[d["what"]]):
            raise PermissionDenied
        start = datetime.combine(d["date_from"], time.min, tzinfo=UTC)
        end = datetime.combine(d["date_to"], time.min, tzinfo=UTC) + timedelta(days=1)
        return stream_csv(EXPORTS[d["what"]](start, end),
                          f"{d['what']}_{d['date_from']:%Y-%m-%d}_{d['date_to']:%Y-%m-%d}.csv")
    context = {**admin.site.each_context(request), "title": gettext("CSV exports"), "form": form}
    return TemplateResponse(request, "admin/ops/exports.html", context)
