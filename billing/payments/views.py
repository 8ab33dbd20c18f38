"""Customer payment pages (mounted at /pay/): pick a coin for an invoice, then the quote's
page — amount, address, QR code, countdown and a status that htmx polls until final."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from rental.teams.rights import customer_view

from ..models import Invoice
from ..services import BillingError
from .late import late_payment_confirm
from .selectors import coin_choices, customer_invoices, customer_quotes, quote_view
from .services import PaymentError, quote_create

POLL_SECONDS = 5


@customer_view({"GET": "view", "POST": "order"})
@login_required
@require_http_methods(["GET", "POST"])
def invoice_pay(request, invoice_id: int):
    invoice = get_object_or_404(customer_invoices(request.account), pk=invoice_id)
    if request.method == "POST" and invoice.state == Invoice.State.OPEN:
        try:
            quote = quote_create(invoice=invoice, coin=request.POST.get("coin", ""), now=timezone.now())
        except PaymentError as exc:
            messages.error(request, str(exc))
        else:
            return redirect("payments:quote", quote_id=quote.pk)
    quotes = invoice.quotes.order_by("-created_at", "-pk")[:10]
    return render(request, "billing/payments/pay.html",
                  {"invoice": invoice, "coins": coin_choices(request.account), "quotes": quotes})


@customer_view({"GET": "view"})
@login_required
def quote_detail(request, quote_id: int):
    quote = get_object_or_404(customer_quotes(request.account), pk=quote_id)
    context = {"v": quote_view(quote, timezone.now()), "poll_seconds": POLL_SECONDS}
    if request.htmx:
        return render(request, "billing/payments/_status.html", context)
    return render(request, "billing/payments/quote.html", context)


@customer_view("order")
@login_required
@require_POST
def quote_pay_demo(request, quote_id: int):
    """Demo store: the demo wallet sends the quote's amount, then the watcher runs its pass
    at once (the beat would a minute later) and credits it through the real payment path."""
    from .demo import demo_coin_send
    from .services import watch_coin

    quote = get_object_or_404(customer_quotes(request.account), pk=quote_id)
    try:
        demo_coin_send(quote=quote, actor=request.account, now=timezone.now())
    except BillingError as exc:
        messages.error(request, str(exc))
    else:
        watch_coin(coin=quote.coin)
        messages.success(request, _("Demo wallet: payment sent. The watcher saw it on the demo chain."))
    return redirect("payments:quote", quote_id=quote.pk)


@customer_view("order")
@login_required
@require_POST
def quote_confirm_late(request, quote_id: int):
    quote = get_object_or_404(customer_quotes(request.account), pk=quote_id)
    try:
        invoice = late_payment_confirm(quote=quote, customer=request.account, now=timezone.now())
    except BillingError as exc:  # sold out, or the credit no longer covers the order
        messages.error(request, str(exc))
        return redirect("payments:quote", quote_id=quote.pk)
    messages.success(request, _("Paid from your balance: invoice #%(id)d.") % {"id": invoice.pk})
    if invoice.lease_id:
        return redirect("lease_detail", lease_id=invoice.lease_id)
    return redirect("billing:invoice", invoice_id=invoice.pk)
