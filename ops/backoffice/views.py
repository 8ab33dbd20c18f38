"""The customer desk under /admin/ops/customers/: find a customer, see everything they
have, adjust the balance or refund an invoice with a reason. Reading needs the permission
to view users; the money actions need the permission to add ledger entries."""
from decimal import Decimal, InvalidOperation

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.db.models import Q
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from billing.models import Invoice, LedgerEntry, Payment
from billing.services import BillingError, account_for
from rental.models import ApiToken, Lease, LeaseState, NetworkVolume, Snapshot
from rental.permissions import ops_view

from .services import balance_adjust, invoice_refund_to_balance

READ_PERM, MONEY_PERM = "auth.view_user", "billing.add_ledgerentry"


class AdjustForm(forms.Form):
    amount = forms.DecimalField(label=gettext_lazy("Amount (USD, negative to debit)"), max_digits=12,
                                decimal_places=2)
    reason = forms.CharField(label=gettext_lazy("Reason"), max_length=200)


class RefundForm(forms.Form):
    invoice = forms.IntegerField(label=gettext_lazy("Invoice #"), min_value=1)
    amount = forms.DecimalField(label=gettext_lazy("Amount (USD; empty: all that is not refunded yet)"),
                                max_digits=12, decimal_places=2, min_value=Decimal("0.01"), required=False)
    reason = forms.CharField(label=gettext_lazy("Reason"), max_length=200)
    lease_keeps_running = forms.BooleanField(
        label=gettext_lazy("I know its lease keeps running (refund anyway)"), required=False,
        help_text=gettext_lazy("Asked when the invoice's lease is still live: the refund returns the money, it "
                               "does not stop the lease."))


def _running_lease_warning(invoice: Invoice) -> str | None:
    """Refunding the invoice of a live lease gives the money back and leaves the lease running:
    the operator is told first and confirms."""
    lease = invoice.lease
    if lease is None or lease.state not in (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED):
        return None
    return _("Lease #%(id)s of invoice #%(invoice)s is %(state)s: the refund returns the money to the balance but "
             "does not stop the lease, which keeps its GPUs until its term ends. Tick the box to refund anyway, or "
             "release the lease first.") % {"id": lease.pk, "invoice": invoice.pk, "state": lease.get_state_display()}


@ops_view(read=READ_PERM)
def customer_list(request):
    q = request.GET.get("q", "").strip()[:150].replace("\x00", "")
    customers = User.objects.filter(is_staff=False).order_by("username")
    if q:
        customers = customers.filter(Q(username__icontains=q) | Q(email__icontains=q))
    context = {**admin.site.each_context(request), "title": _("Customers"), "q": q, "customers": customers[:100]}
    return TemplateResponse(request, "admin/ops/customer_list.html", context)


@ops_view(read=READ_PERM, write=MONEY_PERM)
def customer_detail(request, user_id: int):
    customer = get_object_or_404(User, pk=user_id, is_staff=False)
    adjust, refund = AdjustForm(prefix="adjust"), RefundForm(prefix="refund")
    if request.method == "POST":
        adjust, refund, done = _handle_money_action(request, customer)
        if done:
            return redirect("admin:ops_customer", user_id=customer.pk)
    return TemplateResponse(request, "admin/ops/customer_detail.html", {
        **admin.site.each_context(request), "title": _("Customer %(name)s") % {"name": customer.username},
        "customer": customer, "account": account_for(customer), "adjust_form": adjust, "refund_form": refund,
        "leases": Lease.objects.filter(customer=customer).select_related("offer__gpu_model", "site")[:100],
        "invoices": Invoice.objects.filter(customer=customer).order_by("-created_at", "-pk")[:100],
        "payments": Payment.objects.filter(quote__invoice__customer=customer).select_related("quote")
                    .order_by("-id")[:100],
        "entries": LedgerEntry.objects.filter(account__customer=customer).order_by("-at", "-pk")[:100],
        "tokens": ApiToken.objects.filter(customer=customer).order_by("-created_at", "-pk"),
        "volumes": NetworkVolume.objects.filter(customer=customer).select_related("site").order_by("-created_at", "-pk")[:100],
        "snapshots": Snapshot.objects.filter(customer=customer).select_related("meter").order_by("-created_at", "-pk")[:100],
    }, status=400 if (adjust.errors or refund.errors) else 200)


def _handle_money_action(request, customer):
    adjust, refund = AdjustForm(prefix="adjust"), RefundForm(prefix="refund")
    now = timezone.now()
    try:
        if request.POST.get("action") == "adjust":
            adjust = AdjustForm(request.POST, prefix="adjust")
            if not adjust.is_valid():
                return adjust, refund, False
            cents = _cents(adjust.cleaned_data["amount"])
            balance_adjust(customer=customer, amount_cents=cents, actor=request.user,
                           reason=adjust.cleaned_data["reason"], now=now)
        elif request.POST.get("action") == "refund":
            refund = RefundForm(request.POST, prefix="refund")
            if not refund.is_valid():
                return adjust, refund, False
            invoice = Invoice.objects.filter(customer=customer, pk=refund.cleaned_data["invoice"]).select_related("lease").first()
            if invoice is None:
                refund.add_error("invoice", _("This customer has no such invoice."))
                return adjust, refund, False
            if (warning := _running_lease_warning(invoice)) and not refund.cleaned_data["lease_keeps_running"]:
                refund.add_error("lease_keeps_running", warning)
                return adjust, refund, False
            amount = refund.cleaned_data.get("amount")
            invoice_refund_to_balance(invoice=invoice, actor=request.user, reason=refund.cleaned_data["reason"],
                                      now=now, cents=None if amount is None else _cents(amount))
        else:
            return adjust, refund, False
    except BillingError as exc:
        messages.error(request, str(exc))
        return adjust, refund, False
    messages.success(request, _("Done; recorded with your name and the reason."))
    return adjust, refund, True


def _cents(amount: Decimal) -> int:
    try:
        return int((amount * 100).to_integral_exact())
    except InvalidOperation as exc:
        raise BillingError(_("Amounts are in whole cents.")) from exc
