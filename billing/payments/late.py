"""Late payments: a customer whose payment reached the balance after the quote closed may
still use it for what it was meant to buy — the invoice if it is still open, else the same
order again if its GPUs are free. Once per quote."""
from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext

from inventory.services import SoldOut
from rental.models import ADDON_LIMITS_TB

from ..models import Invoice, LatePaymentClaim, PaymentReview, Quote
from ..services import checkout_place_order, invoice_pay_from_balance
from .credits import auto_credited_cents
from .pricing import PaymentError

QS = Quote.State
QX = Quote.Exception_


def late_payment_confirm(*, quote: Quote, customer, now: datetime | None = None) -> Invoice:
    """Use a late payment (already on the balance) for what it was meant to buy: the invoice
    if still open, else the same order again if the slots are free. Sold out → PaymentError,
    the money stays on the balance. Once per quote."""
    with transaction.atomic():
        now = now or timezone.now()
        quote = Quote.objects.select_for_update(of=("self",)).select_related("invoice__lease").get(pk=quote.pk)
        invoice = quote.invoice
        if invoice.customer_id != customer.pk:
            raise PaymentError(gettext("This quote is not yours."))
        if not late_payment_claimable(quote):
            raise PaymentError(gettext("This quote has no late payment to use."))
        if invoice.state == Invoice.State.OPEN:
            target = invoice_pay_from_balance(invoice=invoice, now=now, actor=customer)
        elif invoice.kind == Invoice.Kind.ORDER and invoice.lease_id:
            target = _reorder(invoice, customer, now)
        else:
            raise PaymentError(gettext("Invoice #%(id)s is %(state)s; the payment stays on your balance.")
                               % {"id": invoice.pk, "state": invoice.get_state_display()})
        LatePaymentClaim.objects.create(quote=quote, invoice=target, at=now)
        return target


def late_payment_claimable(quote: Quote) -> bool:
    """Money of the quote is on the balance (not held for an operator) and not used yet."""
    return (quote.state in (QS.EXPIRED, QS.SETTLED) and quote.exception in (QX.LATE, QX.PARTIAL)
            and int(quote.confirmed) > 0 and quote.invoice.state != Invoice.State.PAID
            and (auto_credited_cents(quote) > 0 or quote.reviews.filter(state=PaymentReview.State.CREDITED).exists())
            and not LatePaymentClaim.objects.filter(quote=quote).exists())


def _reorder(invoice: Invoice, customer, now: datetime) -> Invoice:
    lease = invoice.lease
    assert lease is not None  # claim_late_payment reorders only an order invoice with its lease
    addons = {f: getattr(lease, f) for f in ADDON_LIMITS_TB}  # a retired add-on is not ordered again
    try:
        _, new_invoice = checkout_place_order(
            customer=customer, offer=lease.offer, site=lease.site, term=lease.term, image=lease.image,
            ssh_public_key=lease.ssh_public_key, addons={k: v for k, v in addons.items() if v},
            pay_from_balance=True, now=now)
    except SoldOut:
        raise PaymentError(gettext("That GPU is sold out now; your payment stays on your balance.")) from None
    return new_invoice
