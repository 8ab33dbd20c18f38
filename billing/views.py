"""Customer pages that touch money: the order page (checkout), invoices, the balance with
its top-up, and the one-click refund. One view serves the full page and its htmx partial."""
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from inventory.models import Offer, Site
from inventory.selectors import sites_with_stock_for
from inventory.services import SoldOut
from rental.accounts.services import SshKeyRefused, ssh_key_add
from rental.accounts.throttle import order_address
from rental.forms import ADDON_FIELDS, OrderForm
from rental.models import ADDON_LIMITS_TB, TERM_LENGTH, Image, Lease, Term
from rental.storage import StorageRefused
from rental.teams.rights import customer_view
from rental.timeline import layout, order_milestones
from rental.workbench_views import keep_generated_secrets, order_form_workbench

from .models import Invoice, LedgerEntry
from .payments.demo import invoice_pay_demo
from .payments.selectors import coin_choices, customer_invoices
from .refunds import lease_refund
from .renewals import lease_extend_order
from .services import (
    BillingError,
    InsufficientBalance,
    TooManyOpenOrders,
    account_for,
    checkout_place_order,
    invoice_pay_from_balance,
    order_payment_window,
    price_lines,
    topup_invoice_create,
)


class TopUpForm(forms.Form):
    amount = forms.DecimalField(label=gettext_lazy("Amount (USD)"), min_value=1, max_value=10_000_000, decimal_places=2,
                                widget=forms.NumberInput(attrs={"step": "0.01", "min": "1"}))

    def clean(self):
        data = super().clean()
        if "amount" in data:
            data["amount_cents"] = int(data["amount"] * 100)
        return data


# --- order page ---------------------------------------------------------------------------

def _int_or_zero(value, limit: int) -> int:
    try:
        return min(max(int(value), 0), limit)
    except (TypeError, ValueError):
        return 0


def _choice(data) -> tuple[str, dict[str, int]]:
    """Term and add-ons read leniently from the request, for the live total."""
    term = data.get("term") if data.get("term") in Term.values else Term.MONTH
    return term, {name: _int_or_zero(data.get(name), ADDON_LIMITS_TB[name]) for name in ADDON_FIELDS}


def _summary(offer: Offer, term: str, addons: dict[str, int], *, customer) -> dict:
    lines = price_lines(offer=offer, term=term, addons=addons)
    now = timezone.now()
    milestones = order_milestones(now=now, term_length=TERM_LENGTH[Term(term)],
                                  pay_window=order_payment_window(customer))
    return {"lines": lines, "total_cents": sum(line.amount_cents for line in lines), "term": Term(term),
            "timeline": layout(milestones, now), "per_gpu_hour_cents": offer.per_gpu_hour_cents}


def _order_form(request, offer: Offer, stock: dict, data=None, initial=None) -> OrderForm:
    images = Image.objects.filter(is_active=True, vendor=offer.gpu_model.vendor)
    return OrderForm(data, initial=initial, offer=offer, stock=stock, sites=Site.objects.filter(is_active=True),
                     images=images, customer=request.account)


def _balance_covers(user, offer: Offer, data) -> bool:
    """Preselect “Pay from balance” when the balance pays the order as first shown."""
    return account_for(user).balance_cents >= _summary(offer, *_choice(data), customer=user)["total_cents"]


def _render_order(request, offer, form, stock, *, status=200, sold_out=False):
    source = request.POST if request.method == "POST" else request.GET
    context = {"offer": offer, "form": form, "stock": stock, "sold_out": sold_out,
               "balance_cents": account_for(request.account).balance_cents,
               **_summary(offer, *_choice(source), customer=request.account)}
    template = "billing/_order_summary.html" if request.htmx and request.method == "GET" else "billing/order.html"
    return render(request, template, context, status=status)


@customer_view({"GET": "view", "POST": "order"})
@login_required
@require_http_methods(["GET", "POST"])
def order(request, offer_slug: str):
    offer = get_object_or_404(Offer.objects.select_related("gpu_model"), slug=offer_slug, is_active=True)
    stock = sites_with_stock_for(offer)
    if request.method == "GET":
        if not stock:
            return render(request, "billing/sold_out.html", {"offer": offer})
        initial = {k: v for k, v in request.GET.items()
                   if k in ("site", "term", "image", "restore_from", "image_ref", *ADDON_FIELDS)}
        initial["pay_from_balance"] = _balance_covers(request.account, offer, request.GET)
        return _render_order(request, offer, _order_form(request, offer, stock, initial=initial), stock)
    if "preview" in request.POST:
        initial = request.POST.dict()
        return _render_order(request, offer, _order_form(request, offer, stock, initial=initial), stock)
    form = _order_form(request, offer, stock, data=request.POST)
    form.is_valid()
    order_form_workbench(form)          # the image, variables, secrets and ports (rental.workbench)
    if not form.is_valid():
        return _render_order(request, offer, form, stock, status=400)
    return _place_order(request, offer, form, stock)


def _place_order(request, offer: Offer, form: OrderForm, stock: dict):
    data = form.cleaned_data
    try:
        lease, _invoice = checkout_place_order(
            customer=request.account, offer=offer, site=data["site"], term=data["term"], image=data["image"],
            ssh_public_key=data["ssh_public_key"], addons=form.addons(), pay_from_balance=data["pay_from_balance"],
            client_address=order_address(request), restore_from=data.get("restore_from"),
            workbench=data.get("workbench"))
    except StorageRefused as exc:       # the snapshot is not restorable here or does not fit the disk
        form.add_error("restore_from", str(exc))
        return _render_order(request, offer, form, stock, status=400)
    except SoldOut:
        return _render_order(request, offer, form, sites_with_stock_for(offer), status=409, sold_out=True)
    except InsufficientBalance as exc:
        form.add_error("pay_from_balance", _("%(why)s Nothing was ordered: top up your balance or untick "
                                             "“Pay from balance” to pay the invoice another way.") % {"why": exc})
        return _render_order(request, offer, form, stock, status=400)
    except TooManyOpenOrders as exc:
        form.add_error(None, str(exc))
        return _render_order(request, offer, form, stock, status=409)
    messages.success(request, _("Order placed: lease #%(id)d.") % {"id": lease.pk})
    if data.get("workbench") is not None and data["workbench"].generated:
        # A template's secret made for this lease (the Jupyter token): shown once, on the lease page.
        keep_generated_secrets(request, lease, data["workbench"].generated)
    if form.key_to_save():
        _save_pasted_key(request, form.key_to_save(), lease)
    return redirect("lease_detail", lease_id=lease.pk)


def _save_pasted_key(request, public_key: str, lease: Lease) -> None:
    """The key pasted at ordering, saved as the customer asked, under its own
    comment (else the lease's number). The order stands whatever happens here; a refusal
    (saved already, the key limit, the name taken) is said on the lease page it goes to."""
    comment = public_key.split(" ", 2)[2] if public_key.count(" ") >= 2 else ""
    try:
        key = ssh_key_add(customer=request.account, name=comment or f"lease-{lease.pk}", public_key=public_key)
    except SshKeyRefused as exc:
        messages.warning(request, _("The key was not saved to your account: %(why)s") % {"why": exc})
    else:
        messages.success(request, _("SSH key “%(name)s” saved to your account for later orders.") % {"name": key.name})


# --- invoices -------------------------------------------------------------------------------

@customer_view("view")
@login_required
@require_GET
def invoice_list(request):
    return render(request, "billing/invoices.html", {"invoices": customer_invoices(request.account)[:200]})


@customer_view("view")
@login_required
@require_GET
def invoice_detail(request, invoice_id: int):
    invoice = get_object_or_404(customer_invoices(request.account).prefetch_related("lines"), pk=invoice_id)
    balance = account_for(request.account).balance_cents
    coins = coin_choices(request.account)
    context = {"invoice": invoice, "balance_cents": balance, "coins": coins,
               "coin_codes": ", ".join(c.code for c in coins),
               "can_pay_from_balance": invoice.state == Invoice.State.OPEN and invoice.kind != Invoice.Kind.TOPUP
               and balance >= invoice.amount_cents}
    return render(request, "billing/invoice_detail.html", context)


@customer_view("order")
@login_required
@require_POST
def invoice_pay(request, invoice_id: int):
    invoice = get_object_or_404(customer_invoices(request.account), pk=invoice_id)
    try:
        invoice_pay_from_balance(invoice=invoice, now=timezone.now(), actor=request.account)
    except BillingError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Invoice #%(id)d paid from your balance.") % {"id": invoice.pk})
    return redirect("billing:invoice", invoice_id=invoice.pk)


@customer_view("order")
@login_required
@require_POST
def invoice_pay_demo_view(request, invoice_id: int):
    invoice = get_object_or_404(customer_invoices(request.account), pk=invoice_id)
    try:
        invoice_pay_demo(invoice=invoice, actor=request.account, now=timezone.now())
    except BillingError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _("Demo: invoice #%(id)d marked paid without money.") % {"id": invoice.pk})
    return redirect("billing:invoice", invoice_id=invoice.pk)


# --- balance --------------------------------------------------------------------------------

@customer_view({"GET": "view", "POST": "order"})
@login_required
@require_http_methods(["GET", "POST"])
def balance(request):
    form = TopUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            invoice = topup_invoice_create(customer=request.account, amount_cents=form.cleaned_data["amount_cents"])
        except BillingError as exc:
            form.add_error("amount", str(exc))
        else:
            return redirect("billing:invoice", invoice_id=invoice.pk)
    account = account_for(request.account)
    entries = LedgerEntry.objects.filter(account=account).select_related("invoice")[:200]
    context = {"account": account, "entries": entries, "form": form}
    return render(request, "billing/balance.html", context, status=400 if form.errors else 200)


# --- refund ---------------------------------------------------------------------------------

@customer_view({"GET": "view", "POST": "order"})
@login_required
@require_http_methods(["GET", "POST"])
def refund(request, lease_id: int):
    """GET asks for confirmation (works without JavaScript); POST refunds."""
    lease = get_object_or_404(Lease.objects.filter(customer=request.account).select_related("offer__gpu_model"),
                              pk=lease_id)
    if request.method == "GET":
        return render(request, "billing/refund_confirm.html", {"lease": lease})
    try:
        cents = lease_refund(lease=lease, actor=request.account)
    except BillingError as exc:
        messages.error(request, _("Refund refused: %(why)s") % {"why": exc})
    else:
        messages.success(request, _("Lease #%(id)d cancelled; $%(amount)s returned to your balance.")
                         % {"id": lease.pk, "amount": f"{cents // 100:,}.{cents % 100:02d}"})
    return redirect("lease_detail", lease_id=lease.pk)


# --- Pay the next term now ------------------------------------------------------

@customer_view("order")
@login_required
@require_POST
def lease_extend(request, lease_id: int):
    """The lease page's "Extend by one term" form (no JavaScript needed): pays the next term
    from the balance, or opens its invoice for a crypto payment."""
    lease = get_object_or_404(Lease.objects.filter(customer=request.account), pk=lease_id)
    from_balance = request.POST.get("pay") == "balance"
    try:
        invoice = lease_extend_order(lease=lease, actor=request.account, pay_from_balance=from_balance)
    except BillingError as exc:
        messages.error(request, _("Not extended: %(why)s") % {"why": exc})
        return redirect("lease_detail", lease_id=lease.pk)
    if invoice.state == Invoice.State.PAID:
        lease.refresh_from_db()
        messages.success(request, _("Lease #%(id)d extended: paid until %(end)s UTC.")
                         % {"id": lease.pk, "end": f"{lease.ends_at:%Y-%m-%d %H:%M}"})
        return redirect("lease_detail", lease_id=lease.pk)
    messages.info(request, _("Invoice #%(id)d is the next term; the lease is extended when it is paid.")
                  % {"id": invoice.pk})
    return redirect("payments:invoice", invoice_id=invoice.pk)
