"""Orders and their invoices: checkout, paying from the balance, settling an invoice, top-ups
and an unpaid order's expiry. Billing calls rental's services (never the reverse):
checkout creates the pending lease and its invoice; a paid invoice tells rental to start
or extend a term; a payment that can no longer buy anything goes to the balance.
Renewals are billing/renewals.py, refunds billing/refunds.py."""
import math
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from inventory.models import Offer, Site, StorageProduct
from rental import services as rental
from rental.models import ADDON_LIMITS_TB, Image, Lease, LeaseState, Term
from rental.notifications.services import Event, events_emit, lease_data, lease_event_emit

from . import addons
from .holds import hold_refusal, sku_hold_refusal
from .ledger import (  # noqa: F401 - the ledger's primitives, re-exported for billing's callers
    TERM_DAYS,
    BillingError,
    InsufficientBalance,
    Line,
    Posting,
    RefundLimitReached,
    TooManyOpenOrders,
    account_for,
    balance_top_up,
    invoices_refund_claim,
    ledger_post,
    ledger_post_many,
    month_start,
    payment_window,
    refundable_cents,
)
from .models import Account, Invoice, InvoiceLine, LedgerEntry

ADDON_PRODUCTS = {"extra_nvme_tb": "extra_nvme", "network_volume_tb": "network_volume"}


def has_paid_history(customer: User) -> bool:
    return Invoice.objects.filter(customer=customer, state=Invoice.State.PAID).exists()


def order_payment_window(customer: User) -> timedelta:
    """How long an unpaid order holds its GPUs: shorter for an account that never paid."""
    if has_paid_history(customer):
        return payment_window()
    return min(payment_window(), timedelta(minutes=settings.PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES))


def open_unpaid_orders(customer: User) -> int:
    return Lease.objects.filter(customer=customer, state=LeaseState.PENDING).count()


# --- prices -----------------------------------------------------------------------------

def price_lines(*, offer: Offer, term: str, addons: dict[str, int]) -> list[Line]:
    """The offer for one term plus add-ons priced per TB-month, pro rata for a week
    (rounded up to the cent)."""
    with translation.override("en"):  # stored in English, shown in the reader's language (billing/display)
        return _price_lines(offer=offer, term=Term(term), addons=addons)


def _price_lines(*, offer: Offer, term: Term, addons: dict[str, int]) -> list[Line]:
    base = offer.weekly_cents if term == Term.WEEK else offer.monthly_cents
    lines = [Line(f"{offer.display_name}, {term.label}", 1, base)]
    products = {p.kind: p for p in StorageProduct.objects.filter(kind__in=ADDON_PRODUCTS.values())}
    for field, kind in ADDON_PRODUCTS.items():
        tb = addons.get(field, 0)
        if tb and kind in products:
            unit = math.ceil(products[kind].cents_per_tb_month * TERM_DAYS[term] / 30)
            lines.append(Line(_("%(product)s, %(term)s, per TB") % {"product": products[kind].get_kind_display(), "term": term.label}, tb, unit))
    return lines


def _create_invoice(*, customer, kind, lines: list[Line], now, lease=None, term_start=None, expires_at=None) -> Invoice:
    invoice = Invoice.objects.create(
        customer=customer, lease=lease, kind=kind, term_start=term_start, created_at=now, expires_at=expires_at,
        amount_cents=sum(line.amount_cents for line in lines),
    )
    InvoiceLine.objects.bulk_create([
        InvoiceLine(invoice=invoice, description=line.description, quantity=line.quantity,
                    unit_cents=line.unit_cents, amount_cents=line.amount_cents) for line in lines
    ])
    return invoice


def invoice_data(invoice: Invoice) -> dict:
    """An invoice in webhook payloads."""
    return {"id": invoice.pk, "kind": invoice.kind, "state": invoice.state, "lease": invoice.lease_id,
            "amount_cents": invoice.amount_cents, "term_start": invoice.term_start.isoformat() if invoice.term_start
            else None, "paid_via": invoice.paid_via or None}


# --- balance ----------------------------------------------------------------------------

# --- ordering ---------------------------------------------------------------------------

def addons_validate(addons: dict) -> dict[str, int]:
    """Known add-ons only, whole TB within limits (extra NVMe: the per-node 30 TB)."""
    unknown = set(addons) - set(ADDON_LIMITS_TB)
    if unknown:
        raise BillingError(_("Unknown add-on: %(names)s.") % {"names": ", ".join(sorted(unknown))})
    clean = {}
    for name, value in addons.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= ADDON_LIMITS_TB[name]:
            raise BillingError(_("%(name)s must be a whole number of TB from 0 to %(max)d.")
                               % {"name": name, "max": ADDON_LIMITS_TB[name]})
        clean[name] = value
    return clean


def checkout_place_order(*, customer: User, offer: Offer, site: Site, term: str, image: Image, ssh_public_key: str,
                         addons: dict[str, int] | None = None, pay_from_balance: bool = False,
                         now: datetime | None = None, client_address: str | None = None,
                         restore_from=None, workbench=None) -> tuple[Lease, Invoice]:
    """A pending lease holding its slots + its invoice, atomically; optionally paid from the
    balance at once. Raises inventory.services.SoldOut (nothing is created or charged).
    `client_address`: where the order came from (counted by billing.holds). `restore_from`:
    a snapshot the disk starts from, refused (StorageRefused) before anything is
    created if it is not the customer's ready snapshot at this site or does not fit.
    `workbench`: the order's checked image, variables, secrets and ports
    (rental.workbench.workbench_for_order), stored with the lease."""
    with transaction.atomic():
        from rental.storage import lease_restore_from_set, snapshot_restore_check

        now = now or timezone.now()
        addons = addons_validate(addons or {})
        if restore_from is not None:
            disk_gb = offer.gpu_model.included_nvme_gb + 1000 * addons.get("extra_nvme_tb", 0)
            snapshot_restore_check(snapshot=restore_from, customer=customer, site=site, disk_bytes=disk_gb * 10**9)
        lines = price_lines(offer=offer, term=term, addons=addons)
        _refuse_hoarding(customer, pay_from_balance=pay_from_balance, offer=offer, client_address=client_address,
                         now=now)
        window = order_payment_window(customer)
        lease = rental.lease_create_pending(
            customer=customer, offer=offer, site=site, term=term, image=image, ssh_public_key=ssh_public_key,
            price_cents=sum(line.amount_cents for line in lines), pay_window=window, now=now,
            ordered_from=client_address, **addons,
        )
        if restore_from is not None:
            lease_restore_from_set(lease=lease, snapshot=restore_from, now=now, actor=customer)
        if workbench is not None:   # the customer's image, variables, secrets, ports (rental.workbench)
            from rental.workbench import lease_workbench_init

            lease_workbench_init(lease=lease, workbench=workbench, now=now, actor=customer)
        invoice = _create_invoice(customer=customer, kind=Invoice.Kind.ORDER, lines=lines, now=now, lease=lease,
                                  expires_at=now + window)
        lease_event_emit(event="order.placed", lease=lease, at=None, now=now, invoice=invoice_data(invoice))
        if pay_from_balance:
            invoice_pay_from_balance(invoice=invoice, now=now, actor=customer)
        return lease, invoice


def _refuse_hoarding(customer: User, *, pay_from_balance: bool, offer: Offer, client_address: str | None,
                     now: datetime) -> None:
    """At most MAX_OPEN_UNPAID_ORDERS pending orders per account, and the GPU counts,
    cool-down and SKU share and reserve of billing.holds. The account row is locked so that
    concurrent orders of one customer count one after the other. An order paid from the
    balance at once holds nothing unpaid, so it is not refused."""
    account_for(customer)
    Account.objects.select_for_update().get(customer=customer)
    if pay_from_balance:
        return
    limit = settings.MAX_OPEN_UNPAID_ORDERS
    if open_unpaid_orders(customer) >= limit:
        raise TooManyOpenOrders(
            _("You already have %(n)d unpaid orders holding GPUs: pay or cancel one before ordering more.")
            % {"n": limit})
    refusal = hold_refusal(customer=customer, gpus=offer.gpu_count, client_address=client_address, now=now)
    if refusal:
        raise TooManyOpenOrders(refusal)
    share_refusal = sku_hold_refusal(customer=customer, offer=offer, client_address=client_address)
    if share_refusal is not None:
        raise share_refusal


def _balance_payment(invoice: Invoice, actor=None) -> Posting:
    """The ledger entry that pays an order or renewal invoice from the balance."""
    kind = LedgerEntry.Kind.RENEWAL if invoice.kind == Invoice.Kind.RENEWAL else LedgerEntry.Kind.ORDER
    return Posting(customer=invoice.customer, kind=kind, amount_cents=-invoice.amount_cents, invoice=invoice,
                   actor=actor, memo=f"invoice #{invoice.pk}")


def invoice_pay_from_balance(*, invoice: Invoice, now: datetime, actor=None) -> Invoice:
    with transaction.atomic():
        if invoice.kind == Invoice.Kind.TOPUP:
            raise BillingError(_("A top-up cannot be paid from the balance."))
        ledger_post_many([_balance_payment(invoice, actor)], now=now)
        if not invoice_mark_paid(invoice=invoice, via="balance", now=now, actor=actor):
            raise BillingError(_("Invoice #%(id)s is no longer open.") % {"id": invoice.pk})
        invoice.refresh_from_db()
        return invoice


def invoices_pay_from_balance(invoices: list[Invoice], *, now: datetime) -> list[Invoice]:
    """A lifecycle batch's auto-renewals: each renewal invoice the balance covers is paid from
    it (the rule of `invoice_pay_from_balance`: one ledger statement, one invoice update and
    one lease update for the batch); the others stay open. The invoices are open and this
    transaction's own (just issued), so none can be paid by someone else meanwhile."""
    with transaction.atomic():
        entries = ledger_post_many([_balance_payment(invoice) for invoice in invoices], now=now, refused="skip")
        covered = [invoice for invoice, entry in zip(invoices, entries, strict=True) if entry is not None]
        paid = invoices_mark_paid(covered, via="balance", now=now)
        if len(paid) != len(covered):  # cannot happen for invoices issued in this transaction: undo the batch
            raise BillingError(_("An invoice paid from the balance is no longer open."))
        return paid


def invoice_mark_paid(*, invoice: Invoice, via: str, now: datetime, actor=None, note: str = "") -> bool:
    """open → paid, once; then the lease gets its term. If the lease can no longer be
    started or extended (expired order, released lease) the money goes to the balance.
    One invoice of `invoices_mark_paid`."""
    with transaction.atomic():
        return bool(invoices_mark_paid([invoice], via=via, now=now, actor=actor, note=note))


def invoices_mark_paid(invoices: list[Invoice], *, via: str, now: datetime, actor=None,
                       note: str = "") -> list[Invoice]:
    """`invoice_mark_paid` for many: the invoices that were open and are paid now (each once:
    the open rows are locked and re-checked), their leases started or extended — the
    renewals' in one update — and what can no longer buy a term credited to the balance."""
    with transaction.atomic():
        open_ids = set(Invoice.objects.select_for_update().filter(pk__in=[i.pk for i in invoices],
                                                                  state=Invoice.State.OPEN).values_list("pk", flat=True))
        changed = [invoice for invoice in invoices if invoice.pk in open_ids]
        if not changed:
            return []
        settled_by = actor if (via == "manual" and getattr(actor, "pk", None)) else None
        Invoice.objects.filter(pk__in=open_ids, state=Invoice.State.OPEN).update(
            state=Invoice.State.PAID, paid_at=now, paid_via=via[:20], note=note[:300], settled_by=settled_by)
        for invoice in changed:
            if len(changed) == 1:
                invoice.refresh_from_db()  # one caller's invoice, possibly read long before
            else:  # a batch's own invoices, read in this transaction
                invoice.state, invoice.paid_at, invoice.paid_via, invoice.note, invoice.settled_by = (
                    Invoice.State.PAID, now, via[:20], note[:300], settled_by)
        events_emit([Event(event="invoice.paid", term=f"invoice:{invoice.pk}", customer=invoice.customer,
                           lease=invoice.lease, data=_paid_data(invoice)) for invoice in changed], now=now)
        delivered = _deliver_many(changed, now=now, actor=actor)
        for invoice in changed:
            if invoice.pk not in delivered:
                ledger_post(customer=invoice.customer, kind=LedgerEntry.Kind.LATE_PAYMENT,
                            amount_cents=invoice.amount_cents, now=now, invoice=invoice,
                            memo=f"invoice #{invoice.pk} paid after its lease ended", idempotency_key=f"late:{invoice.pk}")
        return changed


def _paid_data(invoice: Invoice):
    return lambda: {"invoice": invoice_data(invoice),
                    **({"lease": lease_data(invoice.lease)} if invoice.lease_id else {})}


def _deliver_many(invoices: list[Invoice], *, now: datetime, actor) -> set[int]:
    """The invoices whose lease got its term (or top-up its credit): the renewals of distinct
    leases extended together (rental.leases_extend), any other one by itself."""
    renewals, others = {}, []
    for invoice in invoices:
        if invoice.kind == Invoice.Kind.RENEWAL and invoice.lease_id not in renewals:
            renewals[invoice.lease_id] = invoice
        else:
            others.append(invoice)
    extended = rental.leases_extend({lease_id: i.term_start for lease_id, i in renewals.items()}, now=now,
                                    actor=actor, reasons={lease_id: f"renewal invoice #{i.pk} paid"
                                                          for lease_id, i in renewals.items()})
    delivered = {i.pk for lease_id, i in renewals.items() if lease_id in extended}
    return delivered | {i.pk for i in others if _deliver(i, now=now, actor=actor)}


def _deliver(invoice: Invoice, *, now: datetime, actor) -> bool:
    if invoice.kind == Invoice.Kind.TOPUP:
        ledger_post(customer=invoice.customer, kind=LedgerEntry.Kind.TOPUP, amount_cents=invoice.amount_cents, now=now,
                    invoice=invoice, memo=f"invoice #{invoice.pk}", idempotency_key=f"topup:{invoice.pk}")
        return True
    if invoice.kind == Invoice.Kind.ORDER:
        started = rental.lease_start_term(lease_id=invoice.lease_id, now=now, actor=actor,
                                          reason=f"invoice #{invoice.pk}")
        if started:  # the order's add-ons (the network volume: storage.orders) are delivered now
            addons.order_paid(invoice=invoice, now=now)
        return started
    return rental.lease_extend(lease_id=invoice.lease_id, term_start=invoice.term_start, now=now, actor=actor,
                               reason=f"renewal invoice #{invoice.pk} paid")


def invoice_settle_manually(*, invoice: Invoice, actor: User, note: str, now: datetime | None = None) -> bool:
    with transaction.atomic():
        if not note.strip():
            raise BillingError(_("A manual settlement needs a note saying why."))
        return invoice_mark_paid(invoice=invoice, via="manual", now=now or timezone.now(), actor=actor, note=note)


def topup_invoice_create(*, customer: User, amount_cents: int, now: datetime | None = None) -> Invoice:
    if not 100 <= amount_cents <= 10_000_000_00:
        raise BillingError(_("A top-up is between $1 and $10,000,000."))
    now = now or timezone.now()
    return _create_invoice(customer=customer, kind=Invoice.Kind.TOPUP, now=now, expires_at=now + payment_window(),
                           lines=[Line("Balance top-up", 1, amount_cents)])


# --- expiry (called by the lifecycle sweeps) ---------------------------------------------

def order_invoice_expire(*, invoice: Invoice, now: datetime) -> bool:
    """The payment window closed unpaid: invoice expired, pending lease cancelled, slots back."""
    with transaction.atomic():
        changed = Invoice.objects.filter(pk=invoice.pk, state=Invoice.State.OPEN, expires_at__lte=now).update(
            state=Invoice.State.EXPIRED)
        if not changed:
            return False
        if invoice.lease_id:
            rental.lease_cancel(lease_id=invoice.lease_id, now=now, from_states=[LeaseState.PENDING],
                                reason=f"invoice #{invoice.pk} not paid within the payment window")
        return True
