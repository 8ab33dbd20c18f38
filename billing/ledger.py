"""The ledger's primitives, below every money domain: the refusals, a balance entry under
the account's lock, invoice lines, the payment window, what is left to refund of an invoice.

``billing.services`` (orders, renewals, refunds), ``billing.payments``, ``storage``,
``billing.sla`` and ``billing.egress`` all post through here, and this module imports none of
them, so the money domains never import each other in a circle."""
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import BigIntegerField, Case, F, Value, When
from django.utils.translation import gettext as _

from core.money import format_usd
from rental.models import Term

from .models import Account, Invoice, LedgerEntry, OrderedVolume

TERM_DAYS = {Term.WEEK: 7, Term.MONTH: 30}


class BillingError(Exception):
    """A refused money operation, with a message fit for the customer."""


class InsufficientBalance(BillingError):
    pass


class TooManyOpenOrders(BillingError):
    """The account already holds MAX_OPEN_UNPAID_ORDERS unpaid orders (stock hoarding)."""


class RefundLimitReached(BillingError):
    pass


def payment_window() -> timedelta:
    """The standard payment window: of an order (``billing.services.order_payment_window``
    shortens it for new accounts), a top-up, and a crypto quote
    (``billing.payments.config.quote_window`` is this one definition)."""
    return timedelta(minutes=int(settings.PAYMENT_WINDOW_MINUTES))


@dataclass(frozen=True)
class Line:
    description: str
    quantity: int
    unit_cents: int

    @property
    def amount_cents(self) -> int:
        return self.quantity * self.unit_cents


def ceil_div(a: int, b: int) -> int:
    """Integer division rounded up, for cents."""
    return -(-a // b)


# --- balance ----------------------------------------------------------------------------

def account_for(customer: User) -> Account:
    return Account.objects.get_or_create(customer=customer)[0]


def ledger_post(*, customer: User, kind: str, amount_cents: int, now: datetime, invoice=None, actor=None,
                memo: str = "", idempotency_key: str | None = None, allow_negative: bool = False
                ) -> LedgerEntry | None:
    """Append one entry under the account's row lock. With an idempotency key, a repeat is
    a no-op (returns None). Raises InsufficientBalance rather than going below zero — except
    ``allow_negative`` (taking back a payment that left the chain: the customer owes it).
    One posting of `ledger_post_many`."""
    with transaction.atomic():
        [entry] = ledger_post_many([Posting(customer=customer, kind=kind, amount_cents=amount_cents, invoice=invoice,
                                            actor=actor, memo=memo, idempotency_key=idempotency_key,
                                            allow_negative=allow_negative)], now=now)
        return entry


@dataclass
class Posting:
    """One entry for `ledger_post_many` (the arguments of `ledger_post`)."""
    customer: User
    kind: str
    amount_cents: int
    invoice: Invoice | None = None
    actor: Any = None  # a User, or anything without a pk (an anonymous caller): then no actor
    memo: str = ""
    idempotency_key: str | None = None
    allow_negative: bool = False


def ledger_post_many(postings: list[Posting], *, now: datetime, refused: str = "raise") -> list[LedgerEntry | None]:
    """Many entries, in order, under their accounts' row locks (taken in id order, one query
    once the accounts exist): the entry of each, or None for a repeated idempotency key. One
    the balance does not cover (the rule of `ledger_post`) raises InsufficientBalance, or with
    ``refused="skip"`` is None while the others are posted — a lifecycle batch's auto-renewals.
    One UPDATE of the balances and one INSERT of the entries."""
    with transaction.atomic():
        if not postings:
            return []
        accounts = _accounts_locked(postings)
        keys = {p.idempotency_key for p in postings if p.idempotency_key}
        seen = set(LedgerEntry.objects.filter(idempotency_key__in=keys).values_list("idempotency_key", flat=True)
                   ) if keys else set()
        balance = {customer_id: account.balance_cents for customer_id, account in accounts.items()}
        results: list[LedgerEntry | None] = []
        for p in postings:
            customer_id = p.customer.pk
            if customer_id not in accounts:  # the first entry of this customer: as ledger_post, created locked
                accounts[customer_id] = _account_locked(p.customer)
                balance[customer_id] = accounts[customer_id].balance_cents
            current = balance[customer_id]
            new_balance = current + p.amount_cents
            if p.idempotency_key and p.idempotency_key in seen:
                results.append(None)
                continue
            if new_balance < 0 and p.amount_cents < 0 and not p.allow_negative:
                if refused == "raise":
                    raise InsufficientBalance(
                        _("Balance %(balance)s does not cover %(amount)s.")
                        % {"balance": format_usd(current), "amount": format_usd(-p.amount_cents)})
                results.append(None)
                continue
            if p.idempotency_key:
                seen.add(p.idempotency_key)
            balance[customer_id] = new_balance
            results.append(LedgerEntry(
                account=accounts[customer_id], at=now, kind=p.kind, amount_cents=p.amount_cents,
                balance_after_cents=new_balance, invoice=p.invoice, actor=p.actor if getattr(p.actor, "pk", None) else None,
                memo=p.memo[:200], idempotency_key=p.idempotency_key))
        entries = [e for e in results if e is not None]
        if entries:
            _balances_add(entries)
            LedgerEntry.objects.bulk_create(entries)
        return results


def _accounts_locked(postings: list[Posting]) -> dict[int, Account]:
    """The postings' existing accounts, locked in id order (a customer without one gets it
    from `_account_locked`)."""
    ids = sorted({p.customer.pk for p in postings})
    return {a.customer_id: a for a in Account.objects.select_for_update().filter(customer_id__in=ids).order_by("pk")}


def _account_locked(customer: User) -> Account:
    return Account.objects.select_for_update().get_or_create(customer=customer)[0]


def _balances_add(entries: list[LedgerEntry]) -> None:
    deltas: dict[int, int] = {}
    for entry in entries:
        deltas[entry.account.pk] = deltas.get(entry.account.pk, 0) + entry.amount_cents
    if len(deltas) == 1:
        [(pk, delta)] = deltas.items()
        Account.objects.filter(pk=pk).update(balance_cents=F("balance_cents") + delta)
        return
    by_account = Case(*[When(pk=pk, then=Value(delta)) for pk, delta in deltas.items()], default=Value(0),
                      output_field=BigIntegerField())
    Account.objects.filter(pk__in=list(deltas)).update(balance_cents=F("balance_cents") + by_account)


def balance_top_up(*, customer: User, amount_cents: int, now: datetime, actor=None, memo="",
                   idempotency_key=None) -> LedgerEntry | None:
    if amount_cents <= 0:
        raise BillingError(_("A top-up must be a positive amount."))
    return ledger_post(customer=customer, kind=LedgerEntry.Kind.TOPUP, amount_cents=amount_cents, now=now,
                       actor=actor, memo=memo, idempotency_key=idempotency_key)


# --- refunds ----------------------------------------------------------------------------

def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def invoice_volume_held_cents(invoice: Invoice) -> int:
    """The part of an order invoice no refund path may return (refundable_cents, used by the
    customer's refund, a failed provisioning and the customer desk alike): it paid for a
    network volume that exists — the customer's, surviving the lease — or is still being
    created. Once the storage could not create it, storage.orders.ordered_volume_refund
    returns that part."""
    return sum(OrderedVolume.objects.filter(invoice=invoice, state__in=OrderedVolume.HELD)
               .values_list("cents", flat=True))


def refundable_cents(invoice: Invoice) -> int:
    """What is left to refund of an invoice: one amount per invoice, whichever path refunds
    it (the customer's "Cancel and refund", an operator's refund from the customer desk, a
    lease that failed to provision). Only paid orders and renewals are refundable, and never
    the part that paid for a network volume ordered with the lease while that volume exists
    or is still being created (invoice_volume_held_cents): the volume is the customer's and
    survives the lease. The path that finds it cannot be created refunds that part itself."""
    if invoice.state != Invoice.State.PAID or invoice.kind == Invoice.Kind.TOPUP:
        return 0
    return max(0, invoice.amount_cents - invoice.refunded_cents - invoice_volume_held_cents(invoice))


def invoices_refund_claim(*, invoices, now: datetime, cents: int | None = None) -> tuple[int, list[Invoice]]:
    """Take what is left to refund of these invoices (all of it, or at most ``cents``) under
    their row locks, and record it on them; the caller posts the one ledger entry. The
    database refuses more than the invoice's amount (``invoice_refunded_at_most_once``), so
    two refund paths racing cannot both pay it out. Returns (cents taken, invoices touched)."""
    taken, touched = 0, []
    for invoice in Invoice.objects.select_for_update().filter(pk__in=[i.pk for i in invoices]).order_by("pk"):
        part = refundable_cents(invoice)
        if cents is not None:
            part = min(part, cents - taken)
        if part <= 0:
            continue
        Invoice.objects.filter(pk=invoice.pk).update(refunded_cents=F("refunded_cents") + part, refunded_at=now)
        invoice.refunded_cents += part
        taken += part
        touched.append(invoice)
    return taken, touched
