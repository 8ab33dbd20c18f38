"""The API endpoints that move money: orders, invoices, refunds. Plumbing (auth, errors,
lease representation) comes from rental.api."""
import json

from django.db import transaction
from django.http import Http404, JsonResponse
from django.urls import reverse
from django.utils.translation import gettext as _

from inventory.models import Offer, Site
from inventory.selectors import sites_with_stock_for
from inventory.services import SoldOut
from rental.accounts.throttle import order_address
from rental.api import (
    ApiError,
    api_endpoint,
    customer_lease,
    field_errors,
    iso,
    json_body,
    lease_json,
    require_scope,
    token_scopes,
    usd,
)
from rental.forms import ADDON_FIELDS, OrderForm, default_image
from rental.models import RETIRED_ADDONS, Image

from .holds import UnpaidHoldRefused
from .models import Invoice
from .refunds import lease_refund
from .renewals import lease_extend_order
from .services import (
    BillingError,
    InsufficientBalance,
    RefundLimitReached,
    TooManyOpenOrders,
    account_for,
    checkout_place_order,
)

FORM_TO_API = {"ssh_public_key": "ssh_key", **{name: f"addons.{name}" for name in ADDON_FIELDS}}


def invoice_json(invoice: Invoice) -> dict:
    return {
        "id": invoice.pk, "kind": invoice.kind, "state": invoice.state, "lease": invoice.lease_id,
        "amount_cents": invoice.amount_cents, "amount_usd": usd(invoice.amount_cents),
        "created_at": iso(invoice.created_at), "expires_at": iso(invoice.expires_at),
        "paid_at": iso(invoice.paid_at), "paid_via": invoice.paid_via or None,
        "term_start": iso(invoice.term_start),
        "lines": [{"description": line.description, "quantity": line.quantity, "unit_cents": line.unit_cents,
                   "amount_cents": line.amount_cents} for line in invoice.lines.all()],
        "url": reverse("api_invoice", args=[invoice.pk]),
    }


def lease_and_invoice(request, lease, invoice: Invoice) -> JsonResponse:
    """201 with both as they are now (an order, an extension), as the token may see them."""
    lease.refresh_from_db()
    invoice = Invoice.objects.prefetch_related("lines").get(pk=invoice.pk)
    return JsonResponse({"lease": lease_json(lease, scopes=token_scopes(request)), "invoice": invoice_json(invoice)},
                        status=201)


def _order_offer(data: dict) -> Offer:
    slug = data.get("offer")
    if not isinstance(slug, str) or not slug:
        raise field_errors({"offer": [_("Give an offer slug, e.g. from GET /api/v1/offers.")]})
    offer = Offer.objects.select_related("gpu_model").filter(slug=slug, is_active=True).first()
    if offer is None:
        raise field_errors({"offer": [_("No active offer “%(slug)s”.") % {"slug": slug[:60]}]})
    return offer


def _order_form(data: dict, offer: Offer) -> OrderForm:
    addons = data.get("addons") or {}
    if not isinstance(addons, dict):
        raise field_errors({"addons": [_("Give add-ons as an object of TB counts.")]})
    addons = _without_retired(addons)
    unknown = set(addons) - set(ADDON_FIELDS)
    if unknown:
        raise field_errors({"addons": [_("Unknown add-on: %(names)s") % {"names": ", ".join(sorted(unknown))}]})
    if not isinstance(data.get("pay_from_balance", False), bool):
        raise field_errors({"pay_from_balance": [_("Give true or false.")]})
    images = Image.objects.filter(is_active=True, vendor=offer.gpu_model.vendor)
    image = data.get("image") or getattr(default_image(images), "slug", "")
    form_data = {"site": data.get("site") or "", "term": data.get("term") or "", "image": image,
                 "ssh_public_key": data.get("ssh_key") or "", "pay_from_balance": data.get("pay_from_balance") is True,
                 **{name: addons.get(name, 0) for name in ADDON_FIELDS}}
    form = OrderForm(form_data, offer=offer, stock=sites_with_stock_for(offer), sites=Site.objects.filter(is_active=True),
                     images=images)
    if not form.is_valid():
        raise field_errors({FORM_TO_API.get(name, name): [str(m) for m in messages]
                            for name, messages in form.errors.items()})
    return form


def _without_retired(addons: dict) -> dict:
    """A retired add-on (snapshots) given as 0 is dropped, so a client that still sends the
    field as 0 keeps working; any other value is a 400 naming the field — never silently
    accepted and never charged for nothing."""
    asked = [name for name in RETIRED_ADDONS if name in addons and addons[name] != 0]
    if asked:
        raise field_errors({f"addons.{name}": [_(
            "Snapshots are no longer an order add-on: once the lease runs, take one from its page or from My "
            "storage; it is billed per TB-month of what it stores.")] for name in asked})
    return {k: v for k, v in addons.items() if k not in RETIRED_ADDONS}


@api_endpoint("POST", scope="order", also={"pay": "when pay_from_balance is true"}, right="order")
def orders(request):
    data = json_body(request)
    if data.get("pay_from_balance") is True:
        require_scope(request, "pay")
    offer = _order_offer(data)
    form = _order_form(data, offer)
    coin = _order_coin(request, data)  # checked with everything else before anything is created
    site = form.cleaned_data["site"]
    workbench = _order_workbench(request, data, form)
    try:
        with transaction.atomic():  # the order and its quote, or neither
            lease, invoice = checkout_place_order(
                customer=request.api_user, offer=offer, site=site, term=form.cleaned_data["term"],
                image=form.cleaned_data["image"], ssh_public_key=form.cleaned_data["ssh_public_key"],
                addons=form.addons(), pay_from_balance=form.cleaned_data["pay_from_balance"],
                client_address=order_address(request), workbench=workbench)
            quote = _quote(invoice, coin) if coin and invoice.state == Invoice.State.OPEN else None
    except SoldOut as exc:
        raise ApiError(409, "sold_out", _("Just sold out: nothing was charged."), offer=offer.slug,
                       site=site.code, free_by_site=sites_with_stock_for(offer)) from exc
    except InsufficientBalance as exc:
        raise ApiError(402, "insufficient_balance", str(exc)) from exc
    except UnpaidHoldRefused as exc:
        raise ApiError(409, exc.code, str(exc), offer=offer.slug, may_hold_unpaid_gpus=exc.may_hold) from exc
    except TooManyOpenOrders as exc:
        raise ApiError(409, "too_many_unpaid_orders", str(exc)) from exc
    response = lease_and_invoice(request, lease, invoice)
    if workbench.generated:     # a template's secret made for this lease (the Jupyter token), returned once
        response = JsonResponse({**json.loads(response.content), "generated_secrets": workbench.generated},
                                status=201)
        response.shown_once = True      # not kept for an Idempotency-Key replay (rental.idempotency)
    if coin:
        return JsonResponse({**json.loads(response.content), "quote": quote and quote_json(request, quote)},
                            status=201)
    return response


def _order_workbench(request, data: dict, form: OrderForm):
    """The order's image, start command, variables, secrets and ports, checked (rental.workbench),
    or a 400 naming each problem's field and code."""
    from rental.workbench import workbench_for_order
    from rental.workbench_api import order_workbench_args, refused
    from rental.workbench_rules import WorkbenchRefused

    try:
        return workbench_for_order(customer=request.api_user, image=form.cleaned_data["image"],
                                   **order_workbench_args(data))
    except WorkbenchRefused as exc:
        raise refused(exc) from exc


def _order_coin(request, data: dict) -> str | None:
    """The order's optional "coin": one accepted now for this customer, or a 400 listing them."""
    from .payments.services import coins_offered

    coin = data.get("coin")
    if coin is None:
        return None
    offered = [str(c) for c in coins_offered(customer=request.api_user)]
    if not isinstance(coin, str) or coin.upper() not in offered:
        raise field_errors({"coin": [_("Give one of the coins accepted now: %(coins)s.")
                                     % {"coins": ", ".join(offered) or "—"}]})
    return coin.upper()


def _quote(invoice: Invoice, coin: str):
    from django.utils import timezone

    from .payments.pricing import PaymentError
    from .payments.services import quote_create

    try:
        return quote_create(invoice=invoice, coin=coin, now=timezone.now())
    except PaymentError as exc:  # raised inside the order's transaction: the order is undone too
        raise ApiError(409, "quote_refused", str(exc) + " " + _("Nothing was ordered.")) from exc


def quote_json(request, quote) -> dict:
    from .payments.coins.amounts import format_amount
    from .payments.coins.base import Coin

    return {"id": quote.pk, "invoice": quote.invoice_id, "coin": quote.coin, "address": quote.address,
            "amount": format_amount(int(quote.amount), Coin(quote.coin).decimals),
            "amount_base_units": str(quote.amount), "uri": quote.uri, "state": quote.state,
            "expires_at": iso(quote.expires_at),
            "page": request.build_absolute_uri(reverse("payments:quote", args=[quote.pk]))}


@api_endpoint("GET", scope="read", right="view")
def invoice_detail(request, invoice_id: int):
    invoice = (Invoice.objects.prefetch_related("lines")
               .filter(pk=invoice_id, customer=request.api_user).first())
    if invoice is None:
        raise Http404
    return JsonResponse(invoice_json(invoice))


@api_endpoint("POST", scope="pay", right="order")
def refund(request, lease_id: int):
    lease = customer_lease(request, lease_id)
    try:
        cents = lease_refund(lease=lease, actor=request.api_user)
    except RefundLimitReached as exc:
        raise ApiError(409, "refund_limit_reached", str(exc)) from exc
    except BillingError as exc:
        raise ApiError(409, "refund_refused", str(exc)) from exc
    lease.refresh_from_db()
    return JsonResponse({"refunded_cents": cents, "refunded_usd": usd(cents),
                         "lease": lease_json(lease, scopes=token_scopes(request))})


# --- What the command-line client needs ---------------------------------------------

@api_endpoint("GET", scope="read", right="view")
def account(request):
    """Who the token belongs to, what it may do and the balance (the CLI's `login` check)."""
    user, token = request.api_user, request.api_token
    balance = account_for(user).balance_cents
    return JsonResponse({"username": user.username, "token": {"name": token.name, "prefix": token.prefix,
                                                              "scopes": sorted(token.scope_set)},
                         # teams (ADR 0017): who made the token and their role in this account
                         "member": request.api_member.username, "role": request.api_role,
                         "balance_cents": balance, "balance_usd": usd(balance)})


@api_endpoint("GET", scope="read", right="view")
def invoices(request):
    """The customer's invoices, newest first; ?state=open|paid|expired|void filters."""
    rows = Invoice.objects.filter(customer=request.api_user).prefetch_related("lines")
    state = request.GET.get("state", "")
    if state:
        if state not in Invoice.State.values:
            raise field_errors({"state": [_("Give one of: %(states)s.") % {"states": ", ".join(Invoice.State.values)}]})
        rows = rows.filter(state=state)
    return JsonResponse({"invoices": [invoice_json(inv) for inv in rows[:200]]})


@api_endpoint("POST", scope="order", also={"pay": "when pay_from_balance is true"}, right="order")
def lease_extend(request, lease_id: int):
    """Pay the next term now: the renewal invoice of the term starting at the current end
    (one per term, the same the renewal sweep makes), paid from the balance when asked."""
    lease = customer_lease(request, lease_id)
    data = json_body(request)
    from_balance = data.get("pay_from_balance", False)
    if not isinstance(from_balance, bool):
        raise field_errors({"pay_from_balance": [_("Give true or false.")]})
    if from_balance:
        require_scope(request, "pay")
    try:
        invoice = lease_extend_order(lease=lease, actor=request.api_user, pay_from_balance=from_balance)
    except InsufficientBalance as exc:
        raise ApiError(402, "insufficient_balance", str(exc)) from exc
    except BillingError as exc:
        raise ApiError(409, "extend_refused", str(exc)) from exc
    return lease_and_invoice(request, lease, invoice)


@api_endpoint("POST", scope="order", right="order")
def invoice_quote(request, invoice_id: int):
    """{"coin": "LTC"}: the crypto payment details of an open invoice (address, exact
    amount, payment URI, expiry); an unpaid quote for the same coin is reused."""
    from django.utils import timezone

    from .payments.pricing import PaymentError
    from .payments.services import coins_offered, quote_create

    invoice = Invoice.objects.filter(pk=invoice_id, customer=request.api_user).first()
    if invoice is None:
        raise Http404
    coin = json_body(request).get("coin")
    offered = [str(c) for c in coins_offered()]
    if not isinstance(coin, str) or coin.upper() not in offered:
        raise field_errors({"coin": [_("Give one of the coins accepted now: %(coins)s.")
                                     % {"coins": ", ".join(offered) or "—"}]})
    try:
        quote = quote_create(invoice=invoice, coin=coin.upper(), now=timezone.now())
    except PaymentError as exc:
        raise ApiError(409, "quote_refused", str(exc)) from exc
    return JsonResponse(quote_json(request, quote), status=201)


# --- the invoice and balance page's actions -----------------------------------------------------

@api_endpoint("POST", scope="pay", right="order")
def invoice_pay(request, invoice_id: int):
    """Pay an open order or renewal invoice from the balance (the invoice page's button)."""
    from django.utils import timezone

    from .services import invoice_pay_from_balance

    invoice = Invoice.objects.filter(pk=invoice_id, customer=request.api_user).first()
    if invoice is None:
        raise Http404
    try:
        invoice = invoice_pay_from_balance(invoice=invoice, now=timezone.now(), actor=request.api_user)
    except InsufficientBalance as exc:
        raise ApiError(402, "insufficient_balance", str(exc)) from exc
    except BillingError as exc:
        raise ApiError(409, "pay_refused", str(exc)) from exc
    return JsonResponse(invoice_json(Invoice.objects.prefetch_related("lines").get(pk=invoice.pk)))


@api_endpoint("POST", scope="order", right="order")
def top_up(request):
    """{"amount_usd": "50.00"}: a top-up invoice for the balance (the balance page's form),
    paid in a coin like any invoice (POST /api/v1/invoices/{id}/quote)."""
    from .services import topup_invoice_create
    from .views import TopUpForm

    form = TopUpForm({"amount": str(json_body(request).get("amount_usd", ""))})
    if not form.is_valid():
        raise field_errors({"amount_usd": [str(m) for m in form.errors.get("amount", [])]})
    try:
        invoice = topup_invoice_create(customer=request.api_user, amount_cents=form.cleaned_data["amount_cents"])
    except BillingError as exc:
        raise field_errors({"amount_usd": [str(exc)]}) from exc
    return JsonResponse(invoice_json(Invoice.objects.prefetch_related("lines").get(pk=invoice.pk)), status=201)


@api_endpoint("POST", scope="pay", right="order")
def quote_confirm_late(request, quote_id: int):
    """A payment that came after its quote closed is on the balance: use it for what it was
    meant to buy (the quote page's button; once per quote)."""
    from django.utils import timezone

    from .payments.late import late_payment_confirm
    from .payments.selectors import customer_quotes

    quote = customer_quotes(request.api_user).filter(pk=quote_id).first()
    if quote is None:
        raise Http404
    try:
        invoice = late_payment_confirm(quote=quote, customer=request.api_user, now=timezone.now())
    except BillingError as exc:  # sold out, or the credit no longer covers the order
        raise ApiError(409, "refused", str(exc)) from exc
    return JsonResponse(invoice_json(Invoice.objects.prefetch_related("lines").get(pk=invoice.pk)))
