"""Every write that moves money. Billing calls rental's services (never the reverse):
checkout creates the pending lease and its invoice; a paid invoice tells rental to start
or extend a term; a payment that can no longer buy anything goes to the balance."""
import math
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
from inventory.models import Offer, Site, StorageProduct
from rental import services as rental
from rental.models import ADDON_LIMITS_TB, Image, Lease, LeaseState, Term
from rental.notifications.notices import Notice, notify_many, public_url
from rental.notifications.services import Event, events_emit, lease_data, lease_event_emit
from rental.services import lease_auto_renews

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
        if started:  # the order page's network volume add-on is created now
            from .storage.orders import ordered_volume_due

            ordered_volume_due(invoice=invoice, now=now)
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


# --- refunds ----------------------------------------------------------------------------

def refunds_left(customer: User, now: datetime | None = None) -> int:
    """The customer's own no-questions refunds (of money) left this calendar month (UTC);
    operators' refunds and cancelling an unpaid order do not count."""
    now = now or timezone.now()
    used = LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.REFUND, actor=customer,
                                      at__gte=month_start(now)).count()
    return max(0, settings.REFUNDS_PER_MONTH - used)


def _refund_key(prefix: str, touched: list[Invoice]) -> str:
    """Unique per refund step: each invoice's refunded total after it."""
    return f"{prefix}:" + ",".join(f"{i.pk}={i.refunded_cents}" for i in touched)


def _lease_refund_claim(lease: Lease, paid: list[Invoice], *, now: datetime) -> tuple[int, list[Invoice]]:
    """Everything paid for the lease and not refunded yet (``refundable_cents``: a network
    volume created with the order stays paid), an add-on not created yet included (and
    never created): one amount, posted as one refund."""
    from .storage.orders import ordered_volume_cancel

    volume_cents, volume_touched = ordered_volume_cancel(lease=lease, now=now)
    amount, touched = invoices_refund_claim(invoices=paid, now=now)
    claimed = {i.pk: i for i in volume_touched} | {i.pk: i for i in touched}   # the later refunded_cents
    return volume_cents + amount, sorted(claimed.values(), key=lambda i: i.pk)


def _volume_pending_cents(lease: Lease) -> int:
    from .storage.orders import ordered_volume_pending_cents

    return ordered_volume_pending_cents(lease)


def lease_refund(*, lease: Lease, actor: User, now: datetime | None = None) -> int:
    """Before `lease.refund_until` (LEASE_REFUND_WINDOW_MINUTES after the order), no questions
    asked: cancelled, slots freed, key destroyed, what was paid and not refunded yet back to
    the balance. A customer gets REFUNDS_PER_MONTH such refunds of money a month (the account
    row lock makes two at once count as two); every refund is audited. Returns the cents
    refunded."""
    with transaction.atomic():
        now = now or timezone.now()
        lease = Lease.objects.select_for_update().get(pk=lease.pk)
        if lease.customer_id != actor.pk and not actor.is_staff:
            raise BillingError(_("Only the lease's customer or an operator can refund it."))
        if now >= lease.refund_until:
            raise BillingError(_("Refunds are possible within %(minutes)s minutes of ordering; this lease is older.")
                               % {"minutes": settings.LEASE_REFUND_WINDOW_MINUTES})
        if lease.state not in (LeaseState.PENDING, LeaseState.PROVISIONING, LeaseState.ACTIVE):
            raise BillingError(_("A lease that is %(state)s cannot be refunded.") % {"state": lease.get_state_display()})
        # invoices before the account: the customer desk's refund locks in that order too
        paid = list(Invoice.objects.select_for_update().filter(lease=lease, state=Invoice.State.PAID)
                    .exclude(kind=Invoice.Kind.TOPUP).order_by("pk"))
        amount = sum(refundable_cents(i) for i in paid)  # a pending add-on's part is refunded too (cancelled)
        amount += _volume_pending_cents(lease)
        by_customer = actor.pk == lease.customer_id
        if amount and by_customer:
            account_for(lease.customer)
            Account.objects.select_for_update().get(customer=lease.customer)
            if refunds_left(lease.customer, now) <= 0:
                raise RefundLimitReached(
                    _("You have used your %(n)d no-questions refund(s) this month; contact support instead.")
                    % {"n": settings.REFUNDS_PER_MONTH})
        amount, touched = _lease_refund_claim(lease, paid, now=now)
        Invoice.objects.filter(lease=lease, state=Invoice.State.OPEN).update(state=Invoice.State.VOID, note="refunded")
        rental.lease_cancel(lease_id=lease.pk, now=now, actor=actor, reason="refund within the refund window",
                            from_states=[LeaseState.PENDING, LeaseState.PROVISIONING, LeaseState.ACTIVE])
        if amount:
            ledger_post(customer=lease.customer, kind=LedgerEntry.Kind.REFUND, amount_cents=amount, now=now,
                        invoice=touched[0], actor=actor, memo=f"refund of lease #{lease.pk}",
                        idempotency_key=_refund_key("refund", touched))
        used_seconds = max(0, (now - lease.started_at).total_seconds()) if lease.started_at else 0
        audit_record(actor=actor, action="lease_refund", obj=lease,
                     detail={"amount_cents": amount, "by_customer": by_customer, "used_minutes": int(used_seconds // 60),
                             "invoices": [i.pk for i in touched]})
        return amount


def lease_fail_and_refund(*, lease: Lease, now: datetime) -> int | None:
    """The lease is still provisioning past NODE_PROVISIONING_DEADLINE: it fails (slots
    freed), everything paid for it goes back to the balance and the customer is told.
    Returns the cents refunded, or None when the lease was not failed (moved meanwhile)."""
    with transaction.atomic():
        if not rental.lease_fail(lease_id=lease.pk, now=now, reason="no instance came up within the provisioning "
                                                                      "deadline"):
            return None
        paid = Invoice.objects.filter(lease=lease, state=Invoice.State.PAID).exclude(kind=Invoice.Kind.TOPUP)
        amount, touched = _lease_refund_claim(lease, list(paid), now=now)
        Invoice.objects.filter(lease=lease, state=Invoice.State.OPEN).update(state=Invoice.State.VOID,
                                                                            note="lease failed to provision")
        if amount:
            ledger_post(customer=lease.customer, kind=LedgerEntry.Kind.REFUND, amount_cents=amount, now=now,
                        invoice=touched[0], memo=f"lease #{lease.pk} could not be provisioned",
                        idempotency_key=_refund_key("failed", touched))
        args = {"id": lease.pk, "offer": lease.offer, "amount": format_usd(amount),
                "minutes": int(settings.NODE_PROVISIONING_DEADLINE.total_seconds() // 60)}
        with rental.customer_language(lease.customer):
            rental.notify(lease=lease, kind="provisioning_failed", deadline=now,
                          subject=_("Lease #%(id)s (%(offer)s) could not be provisioned") % args,
                          body=_("We could not start your instance of lease #%(id)s within %(minutes)s minutes. The "
                                 "lease is cancelled, its GPUs are freed and %(amount)s is back on your balance; you "
                                 "can order again at once.") % args)
        return amount


# --- renewals and expiry (called by the lifecycle sweeps) --------------------------------

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
