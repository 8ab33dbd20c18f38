"""Refunds of a lease to the customer's balance: the customer's own within the refund window
(REFUNDS_PER_MONTH of them a month, counted under the account lock), and everything paid for
a lease that could not be provisioned in time."""
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from core.money import format_usd
from inventory.audit import audit_record
from rental import services as rental
from rental.models import Lease, LeaseState

from . import addons
from .ledger import (
    BillingError,
    RefundLimitReached,
    account_for,
    invoices_refund_claim,
    ledger_post,
    month_start,
    refundable_cents,
)
from .models import Account, Invoice, LedgerEntry


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
    volume_cents, volume_touched = addons.lease_cancel(lease=lease, now=now)
    amount, touched = invoices_refund_claim(invoices=paid, now=now)
    claimed = {i.pk: i for i in volume_touched} | {i.pk: i for i in touched}   # the later refunded_cents
    return volume_cents + amount, sorted(claimed.values(), key=lambda i: i.pk)


def _volume_pending_cents(lease: Lease) -> int:
    return addons.pending_cents(lease)


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
