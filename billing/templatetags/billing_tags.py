"""What rental's pages show from billing, without rental importing billing: a lease's
invoices and whether its one-click refund is still open."""
from django import template
from django.conf import settings
from django.utils import timezone

from billing import addons
from billing.models import Invoice
from billing.refunds import refunds_left
from core.memo import memo_on_instance
from rental.models import LeaseState

register = template.Library()

REFUNDABLE_STATES = (LeaseState.PENDING, LeaseState.PROVISIONING, LeaseState.ACTIVE)


@register.simple_tag
@memo_on_instance
def lease_invoices(lease):
    """`{% lease_invoices lease as invoices %}` — the lease's invoices, newest first."""
    return list(Invoice.objects.filter(lease=lease, customer_id=lease.customer_id).order_by("-created_at", "-id"))


@register.simple_tag
def refund_deadline(lease):
    """When the refund window closes, or None when this lease cannot be refunded now."""
    if lease.state not in REFUNDABLE_STATES:
        return None
    return lease.refund_until if timezone.now() < lease.refund_until else None


@register.filter
def invoice_line(description: str) -> str:
    """An invoice line in the reader's language (stored in English)."""
    from billing.display.lines import line_text

    return line_text(description)


@register.simple_tag
def refund_blocked(lease, allowance) -> bool:
    """The customer's refunds of money are used up this month and this lease was paid for:
    its one-click refund would be refused, so the button is not offered (cancelling an
    unpaid order stays possible)."""
    return allowance["left"] <= 0 and Invoice.objects.filter(
        lease=lease, state=Invoice.State.PAID).exclude(kind=Invoice.Kind.TOPUP).exists()


@register.simple_tag
def refund_allowance(customer):
    """`{% refund_allowance user as allowance %}` — (left, per month) of the customer's own
    no-questions refunds, shown before they ask for one."""
    return {"left": refunds_left(customer), "per_month": settings.REFUNDS_PER_MONTH}


@register.simple_tag
def lease_extension(lease):
    """`{% lease_extension lease as ext %}` — whether "extend by one term" is
    offered now, its price and the balance that could pay it; None when it is not."""
    from billing.renewals import EXTENDABLE
    from billing.services import account_for

    if lease.state not in EXTENDABLE or lease.ends_at is None:
        return None
    ahead = lease.ends_at - timezone.now()
    if ahead.total_seconds() > settings.LEASE_EXTEND_MAX_AHEAD_DAYS * 86400:
        return None
    return {"price_cents": lease.price_cents, "balance_cents": account_for(lease.customer).balance_cents,
            "new_end": lease.ends_at + lease.term_length}


@register.simple_tag
def lease_term_price(lease) -> dict:
    """`{% lease_term_price lease as term_price %}` — what each renewal of the lease costs
    ("cents"), and the part of its order that was for a network volume still being created
    ("volume_cents"): once created, the volume renews on its own term and the lease's renewals
    no longer include it (rental.storage.lease_volume_addon_settled), so it is not shown as
    part of the locked price."""
    volume = addons.price_cents(lease)
    return {"cents": lease.price_cents - volume, "volume_cents": volume}
