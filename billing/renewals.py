"""Renewals: the renewal invoice of a lease's next term (once per term, made by the lifecycle
sweep or the customer's "extend", whichever asks first), with its lines, egress overage and
notice, paid from the balance when the lease auto-renews; and the customer's order of the
next term now (`lease_extend_order`)."""
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from core.money import format_usd
from core.rows import insert_many_once
from inventory.audit import audit_record
from rental import services as rental
from rental.models import Lease, LeaseState, Term
from rental.notifications.notices import Notice, notify_many, public_url
from rental.services import lease_auto_renews

from .ledger import BillingError, Line
from .models import Invoice, InvoiceLine
from .services import invoice_pay_from_balance, invoices_pay_from_balance


def renewal_invoice_create(*, lease: Lease, now: datetime) -> Invoice | None:
    """The renewal for the term starting at the current end, at the locked price; once per
    term (database constraint). Auto-paid from the balance when the lease's auto-renew
    (its own, else the account's default) allows it. One lease of `renewal_invoices_create`."""
    with transaction.atomic(savepoint=False):  # no expected error to recover from: the sweep's batch is the unit
        made = renewal_invoices_create([lease], now=now)
        return made[0] if made else None


def renewal_invoices_create(leases: list[Lease], *, now: datetime) -> list[Invoice]:
    """The renewal sweep's batch: the renewal invoices made now (a lease whose term already has
    one is left out), those of auto-renewing leases that the balance covers paid from it.

    When a balance covers only some of an account's renewals, the rule is renewal_payment_order:
    the earliest term first (ties: the older lease), whatever order the leases came in; a
    renewal the remaining balance does not cover stays open and the later ones are still tried."""
    with transaction.atomic(savepoint=False):
        made = [invoice for invoice, created in renewal_invoices_issue(leases, now=now) if created]
        auto = sorted((invoice for invoice in made if lease_auto_renews(invoice.lease)), key=renewal_payment_order)
        invoices_pay_from_balance(auto, now=now)
        return made


def renewal_payment_order(invoice: Invoice) -> tuple:
    """Which renewal a balance pays first: the earliest term start, then the older lease."""
    return (invoice.term_start, invoice.lease_id)


def renewal_invoice_issue(*, lease: Lease, now: datetime) -> tuple[Invoice, bool]:
    """The renewal invoice of the term starting at the lease's current end: made (with its
    notice) when there is none, else the one that exists — one per (lease, term start),
    whether the sweep or the customer's "extend" asked first. Returns (invoice, created).
    One lease of `renewal_invoices_issue`."""
    with transaction.atomic(savepoint=False):  # no expected error to recover from: the sweep's batch is the unit
        [issued] = renewal_invoices_issue([lease], now=now)
        return issued


def renewal_invoices_issue(leases: list[Lease], *, now: datetime) -> list[tuple[Invoice, bool]]:
    """(invoice, created) for each lease (distinct leases with their customer loaded), in order:
    the invoices, their lines, the egress overage they bill and their notices in a few
    statements for the batch. The unique constraint (one renewal per lease and term start) is
    the arbiter: an INSERT … ON CONFLICT DO NOTHING, so a term invoiced before — by another
    pass, or the customer's "extend" — gives that invoice, not an error, and the rest of the
    batch goes on."""
    with transaction.atomic(savepoint=False):
        from .egress import egress_overage, egress_overage_mark

        overage = egress_overage(leases)  # marked invoiced below, for the invoices made now only
        lines = {lease.pk: [_renewal_line(lease)] + [line for *_, line in overage.get(lease.pk, [])] for lease in leases}
        invoices = [Invoice(customer=lease.customer, lease=lease, kind=Invoice.Kind.RENEWAL, term_start=lease.ends_at,
                            created_at=now, amount_cents=sum(line.amount_cents for line in lines[lease.pk]))
                    for lease in leases]
        created = {invoice.lease_id for invoice in insert_many_once(invoices, key=("lease_id",))}
        made = [invoice for invoice in invoices if invoice.lease_id in created]
        InvoiceLine.objects.bulk_create([
            InvoiceLine(invoice=invoice, description=line.description, quantity=line.quantity,
                        unit_cents=line.unit_cents, amount_cents=line.amount_cents)
            for invoice in made for line in lines[invoice.lease_id]])
        egress_overage_mark([item for invoice in made for item in overage.get(invoice.lease_id, [])])
        notify_many([_renewal_notice(invoice) for invoice in made], now=now)
        existing = _renewals_issued_before([invoice for invoice in invoices if invoice.lease_id not in created])
        return [(invoice, True) if invoice.lease_id in created else (existing[invoice.lease_id], False)
                for invoice in invoices]


def _renewal_line(lease: Lease) -> Line:
    with translation.override("en"):  # stored in English, shown in the reader's language (billing/display)
        return Line(_("Renewal of lease #%(id)s: %(offer)s, %(term)s")
                    % {"id": lease.pk, "offer": lease.offer, "term": Term(lease.term).label}, 1, lease.price_cents)


def _renewal_notice(invoice: Invoice) -> Notice:
    """The coin amount is not in the notice: a coin amount is a quote, fixed for the payment
    window from when the customer picks the coin on the invoice's page, which the notice
    links to (a rate written into an e-mail days before would be wrong by the time it is paid)."""
    lease = invoice.lease
    with rental.customer_language(lease.customer):
        return Notice(lease=lease, kind="renewal_invoice", deadline=lease.ends_at,
                      subject=_("Renewal invoice #%(invoice)s for lease #%(lease)s")
                      % {"invoice": invoice.pk, "lease": lease.pk},
                      body=_("Renewal of lease #%(lease)s: %(amount)s, due before %(due)s UTC. Pay it at %(url)s — "
                             "choose a coin there, and its amount is fixed for %(minutes)s minutes from then.")
                      % {"lease": lease.pk, "amount": format_usd(invoice.amount_cents),
                         "due": f"{lease.ends_at:%Y-%m-%d %H:%M}",
                         "url": public_url(reverse("payments:invoice", args=[invoice.pk])),
                         "minutes": settings.PAYMENT_WINDOW_MINUTES})


def _renewals_issued_before(unsaved: list[Invoice]) -> dict[int, Invoice]:
    """{lease id: the renewal invoice that already held the term} for the invoices not made."""
    if not unsaved:
        return {}
    terms = Q()
    for invoice in unsaved:
        terms |= Q(lease_id=invoice.lease_id, term_start=invoice.term_start)
    return {i.lease_id: i for i in Invoice.objects.filter(terms, kind=Invoice.Kind.RENEWAL)}


EXTENDABLE = (LeaseState.ACTIVE, LeaseState.SUSPENDED)


def lease_extend_order(*, lease: Lease, actor: User, pay_from_balance: bool = False,
                       now: datetime | None = None) -> Invoice:
    """The customer pays the next term now ("extend by a week/month"): the renewal invoice
    of the term that starts at the current end, at the locked price (the same invoice the
    renewal sweep makes, so asking twice, or the sweep and the customer at once, make one),
    paid from the balance when asked. Once paid the term is added and the next "extend"
    invoices the term after it. Raises BillingError (InsufficientBalance) with the reason."""
    with transaction.atomic():
        now = now or timezone.now()
        lease = Lease.objects.select_for_update().select_related("customer", "offer__gpu_model").get(pk=lease.pk)
        if lease.customer_id != actor.pk:
            raise BillingError(_("Only the lease's customer can extend it."))
        if lease.state not in EXTENDABLE or lease.ends_at is None:
            raise BillingError(_("Lease #%(id)s is %(state)s: only a running or suspended lease can be extended.")
                               % {"id": lease.pk, "state": lease.get_state_display()})
        ahead = lease.ends_at - now
        if ahead > timedelta(days=settings.LEASE_EXTEND_MAX_AHEAD_DAYS):
            raise BillingError(_("Lease #%(id)s is paid until %(end)s UTC; extend it again closer to that date.")
                               % {"id": lease.pk, "end": f"{lease.ends_at:%Y-%m-%d %H:%M}"})
        invoice, created = renewal_invoice_issue(lease=lease, now=now)
        audit_record(actor=actor, action="lease_extend_order", obj=lease,
                     detail={"invoice": invoice.pk, "term_start": lease.ends_at.isoformat(), "created": created,
                             "pay_from_balance": pay_from_balance})
        if pay_from_balance and invoice.state == Invoice.State.OPEN:
            invoice_pay_from_balance(invoice=invoice, now=now, actor=actor)
        invoice.refresh_from_db()
        return invoice
