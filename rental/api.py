"""The JSON API, version 1: plain Django views returning JSON. Customers authenticate
with `Authorization: Bearer <token>` (tokens from the settings page); the session and its
cookie are never used here, so these views are CSRF-exempt. Every error is JSON with a
4xx status: 400 bad input naming the field, 401 no or bad token, 403 the token lacks the
route's scope, 404 not found or not yours, 405 wrong method, 409 sold out or refused, 413
body over 64 KB, 429 over a rate limit (with Retry-After). Every route declares its scope
in its api_endpoint decorator; docs/API.md's table is checked against them.

The views that touch money (orders, invoices, refunds) live in billing/api.py, which
uses the plumbing here (rental never imports billing)."""
import json
from functools import wraps

from django.conf import settings
from django.http import Http404, JsonResponse
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt

from core.audit import acting_member
from inventory.models import Site
from inventory.selectors import catalog_rows

from .accounts.services import SshKeyRefused, api_token_authenticate, ssh_key_add, ssh_key_delete
from .accounts.throttle import throttle_take_reserving
from .api_schema import build_schema, iso
from .idempotency import run_once
from .models import Image, Lease, NetworkVolume, Snapshot, SshKey
from .services import account_auto_renew, lease_auto_renew_set, lease_auto_renews
from .teams.rights import (
    SCOPE_RIGHTS,
    TEAM,
    declared_rights,
    needed_right,
    role_of,
    role_rights,
)

MAX_BODY_BYTES = 64 * 1024
MAX_JSON_DEPTH = 20  # our bodies nest 2 deep; deeper is an attack on the parser


class ApiError(Exception):
    def __init__(self, status: int, error: str, message: str, **extra):
        super().__init__(message)
        self.status, self.error, self.message, self.extra = status, error, message, extra

    def response(self) -> JsonResponse:
        return error_response(self.status, self.error, self.message, **self.extra)


def error_response(status: int, error: str, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": error, "message": str(message), **extra}, status=status)


def usd(cents: int | None) -> str | None:
    """Cents as a decimal string without floats: 47500 → '475.00'."""
    if cents is None:
        return None
    sign = "-" if cents < 0 else ""
    whole, rest = divmod(abs(int(cents)), 100)
    return f"{sign}{whole}.{rest:02d}"


# --- plumbing -----------------------------------------------------------------------------

def _bearer_token(request) -> str:
    scheme, _sep, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _body_too_big(request) -> bool:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > MAX_BODY_BYTES
    except ValueError:
        return True


def require_scope(request, scope: str) -> None:
    """403 unless the request's token carries `scope` (read, order, manage or pay) and, for
    a scope beyond the route's own, its member's role has the matching right (teams)."""
    _require_token_scope(request, scope)
    require_right(request, SCOPE_RIGHTS[scope])


def _require_token_scope(request, scope: str) -> None:
    token = getattr(request, "api_token", None)
    if token is None or scope not in token.scope_set:
        raise ApiError(403, "insufficient_scope",
                       _("This token lacks the “%(scope)s” scope; make one that has it in your settings.")
                       % {"scope": scope}, scope=scope)


def require_right(request, right: str) -> None:
    """403 unless the token's member's role in the account has `right` (rental.teams.rights)."""
    if right not in role_rights(getattr(request, "api_role", None)):
        raise ApiError(403, "role_forbids",
                       _("Your role in this account (%(role)s) does not allow this.")
                       % {"role": getattr(request, "api_role", None) or "none"}, right=right)


PUBLIC = None  #: the scope of a route anyone may call, without a token


def _too_many(limit_setting: str) -> JsonResponse:
    response = error_response(429, "rate_limited", _("Too many requests; try again in a minute."),
                              limit=limit_setting)
    response["Retry-After"] = str(API_RATE_WINDOW_SECONDS)  # at most one window
    return response


#: Rate limits count fixed windows of this length (the limits are per minute).
API_RATE_WINDOW_SECONDS = 60


def _within_rate(request, scope: str, limit_setting: str, key: str | None = None) -> bool:
    return throttle_take_reserving(scope, request, limit=getattr(settings, limit_setting),
                                   window_seconds=API_RATE_WINDOW_SECONDS, key=key,
                                   reservations_per_window=settings.API_RATE_RESERVATIONS_PER_WINDOW)


def api_endpoint(*methods: str, scope, also: dict[str, str] | None = None, right=None):
    """Method check (405), body size (413), rate limits per client address and per token
    (429 with Retry-After), bearer auth (401), the token's scope (403) and JSON errors for a
    view; the customer is `request.api_user`, the token `request.api_token`.

    `scope` is declared on every route, here and nowhere else: one scope for every method,
    a {method: scope} mapping, or PUBLIC (no token). `also` names scopes a request needs
    only in some cases ({"pay": "when pay_from_balance is true"}), which the view checks
    with require_scope. Both are kept on the view (`api_scopes`, `api_also`) for the route
    table in docs/API.md and for the test that walks every route.

    `right` (teams, ADR 0017): what the token's member's role in the account must allow,
    one right (rental.teams.rights: VIEW, ORDER, OPERATE, TOKENS, WEBHOOKS, TEAM) or a
    {method: right} mapping; kept as `api_rights`. A route with a token scope that declares
    no right is the owners' only (and tests/rental/test_team_rights.py fails on it)."""
    per_method = dict(scope) if isinstance(scope, dict) else {method: scope for method in methods}
    if set(per_method) != set(methods):
        raise ValueError(f"declare a scope for each of {methods}, no more")
    rights = None if right is None else declared_rights(right)

    def decorate(view):
        @csrf_exempt
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if request.method not in methods:
                response = error_response(405, "method_not_allowed",
                                          _("Use %(methods)s here.") % {"methods": ", ".join(methods)})
                response["Allow"] = ", ".join(methods)
                return response
            if _body_too_big(request):
                return error_response(413, "too_large", _("Request bodies are limited to 64 KB."))
            # Per address first: it also slows whoever guesses tokens.
            if not _within_rate(request, "api-address", "API_REQUESTS_PER_IP_PER_MINUTE"):
                return _too_many("API_REQUESTS_PER_IP_PER_MINUTE")
            needed = per_method[request.method]
            request.api_token = api_token_authenticate(_bearer_token(request)) if _bearer_token(request) else None
            # The account the token acts for, the member who made it and their role now: a
            # demoted or removed member's tokens lose that power at once (ADR 0017).
            request.api_user = request.api_token.customer if request.api_token else None
            request.api_member = (request.api_token.member or request.api_user) if request.api_token else None
            request.api_role = role_of(account=request.api_user, member=request.api_member)
            if request.api_token is not None and request.api_role is None:
                request.api_token = request.api_user = request.api_member = None  # no longer in the account
            if needed is not PUBLIC and request.api_user is None:
                response = error_response(401, "unauthorized", _("Send a valid API token as 'Authorization: Bearer <token>'."))
                response["WWW-Authenticate"] = 'Bearer realm="api"'
                return response
            if request.api_token is not None and not _within_rate(
                    request, "api-token", "API_REQUESTS_PER_TOKEN_PER_MINUTE", key=f"token:{request.api_token.pk}"):
                return _too_many("API_REQUESTS_PER_TOKEN_PER_MINUTE")
            try:
                if needed is not PUBLIC:
                    _require_token_scope(request, needed)
                    require_right(request, needed_right(rights, request.method) if rights else TEAM)
            except ApiError as exc:
                return exc.response()

            def call():
                try:
                    return view(request, *args, **kwargs)
                except ApiError as exc:
                    return exc.response()
                except Http404:
                    return error_response(404, "not_found", _("Not found."))

            # A write with an Idempotency-Key runs once per account and key (rental.idempotency).
            if request.api_user is None:
                return call()
            with acting_member(account_id=request.api_user.pk, member=request.api_member):
                return run_once(request, request.api_user, call)
        wrapper.api_scopes = per_method
        wrapper.api_rights = rights
        wrapper.api_also = dict(also or {})
        return wrapper
    return decorate


def json_body(request) -> dict:
    """The request's JSON object, or a 400 (413 when it is larger than announced)."""
    if len(request.body) > MAX_BODY_BYTES:
        raise ApiError(413, "too_large", _("Request bodies are limited to 64 KB."))
    try:
        data = json.loads(request.body.decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ApiError(400, "bad_json", _("The body is not valid JSON.")) from exc
    if not isinstance(data, dict):
        raise ApiError(400, "bad_json", _("The body must be a JSON object."))
    _refuse_deep_or_nul(data)
    return data


def _refuse_deep_or_nul(data) -> None:
    """400 for nesting deeper than MAX_JSON_DEPTH or a NUL in any string (PostgreSQL text
    cannot hold one). Iterative, so no input can exhaust the stack."""
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, "bad_json", _("The body nests too deeply."))
        if isinstance(item, str) and "\x00" in item:
            raise ApiError(400, "bad_json", _("Strings must not contain NUL characters."))
        if isinstance(item, dict):
            stack.extend((x, depth + 1) for pair in item.items() for x in pair)
        elif isinstance(item, list):
            stack.extend((x, depth + 1) for x in item)


def field_errors(errors: dict[str, list[str]]) -> ApiError:
    return ApiError(400, "invalid", _("Some fields are not valid."), fields=errors)


def customer_lease(request, lease_id: int) -> Lease:
    lease = (Lease.objects.select_related("offer__gpu_model", "site", "image", "registry_credential")
             .filter(pk=lease_id, customer=request.api_user).first())
    if lease is None:
        raise Http404
    return lease


# --- representations ------------------------------------------------------------------------

def offer_json(row) -> dict:
    offer = row.offer
    return {
        "slug": offer.slug, "name": offer.display_name, "gpu": row.gpu.name, "vendor": row.gpu.vendor,
        "gpus": offer.gpu_count, "vram_gb": row.gpu.vram_gb, "link": row.gpu.link_description,
        "weekly_cents": offer.weekly_cents, "weekly_usd": usd(offer.weekly_cents),
        "monthly_cents": offer.monthly_cents, "monthly_usd": usd(offer.monthly_cents),
        "per_gpu_hour_cents": offer.per_gpu_hour_cents, "per_gpu_hour_usd": usd(offer.per_gpu_hour_cents),
        "free_by_site": row.free_by_site, "free_total": row.free_total,
    }


#: Fields of a reply that only a token with the scope may see (a token for placing orders
#: learns what it ordered and what to pay, not where the instance answers).
LEASE_FIELD_SCOPES = {"ssh": "read", "events": "read", "workbench": "read"}


def token_scopes(request) -> frozenset[str]:
    token = getattr(request, "api_token", None)
    return frozenset(token.scope_set) if token is not None else frozenset()


def lease_json(lease: Lease, *, scopes: frozenset[str], events: bool = False,
               account_default: bool | None = None) -> dict:
    """The lease as the API shows it to a token with `scopes` (token_scopes(request)):
    fields in LEASE_FIELD_SCOPES are left out unless the token has their scope."""
    data = {
        "id": lease.pk, "state": lease.state, "offer": lease.offer.slug, "site": lease.site.code,
        "image": lease.image.slug, "term": lease.term, "price_cents": lease.price_cents,
        "price_usd": usd(lease.price_cents),
        "addons": {"extra_nvme_tb": lease.extra_nvme_tb, "network_volume_tb": lease.network_volume_tb,
                   "snapshot_tb": lease.snapshot_tb},
        "created_at": iso(lease.created_at), "pay_by": iso(lease.pay_by), "started_at": iso(lease.started_at),
        "ends_at": iso(lease.ends_at), "renewal_invoice_at": iso(lease.renewal_due_at),
        "refund_until": iso(lease.refund_until), "suspended_at": iso(lease.suspended_at),
        "hold_until": iso(lease.hold_until), "wipe_by": iso(lease.wipe_by), "ended_at": iso(lease.ended_at),
        "ssh": {"host": lease.host, "port": lease.ssh_port, "command": lease.ssh_command} if lease.ssh_command else None,
        "url": reverse("api_lease", args=[lease.pk]),
        # This lease's own choice (null: the account's default) and what applies.
        "auto_renew_setting": lease.auto_renew,
        "auto_renew": lease_auto_renews(lease, account_default=account_default),
    }
    from .workbench import workbench_json  # image, variables, secrets by name, ports

    data["workbench"] = workbench_json(lease)
    if events:      # the detail: one query more, never per row of the list
        data["node_key_fingerprints"] = lease.node_key_fingerprints()
        data["events"] = [{"at": iso(e.at), "kind": e.kind, "from": e.from_state, "to": e.to_state,
                           "reason": e.reason} for e in lease.events.all()]
    return {name: value for name, value in data.items()
            if name not in LEASE_FIELD_SCOPES or LEASE_FIELD_SCOPES[name] in scopes}


# --- views ------------------------------------------------------------------------------------

@api_endpoint("GET", scope=PUBLIC)
def offers(request):
    return JsonResponse({"offers": [offer_json(row) for row in catalog_rows()]})


@api_endpoint("GET", scope="read", right="view")
def leases(request):
    rows = (Lease.objects.filter(customer=request.api_user)
            .select_related("offer__gpu_model", "site", "image", "registry_credential").order_by("-created_at", "-pk")[:200])
    default = account_auto_renew(request.api_user.pk)       # one read for the whole list
    return JsonResponse({"leases": [lease_json(lease, scopes=token_scopes(request), account_default=default)
                                  for lease in rows]})


@api_endpoint("GET", scope="read", right="view")
def lease_detail(request, lease_id: int):
    return JsonResponse(lease_json(customer_lease(request, lease_id), scopes=token_scopes(request), events=True))


@api_endpoint("GET", scope=PUBLIC)
def schema(request):
    return JsonResponse(build_schema(), json_dumps_params={"indent": 1})


# --- What the command-line client needs ---------------------------------------------

@api_endpoint("POST", scope="manage", also={"pay": "unless it turns it off: true or null (the account's default) lets renewals spend the balance"}, right="order")
def lease_auto_renew(request, lease_id: int):
    """{"auto_renew": true | false | null}: null follows the account's default. Turning it
    off can let a lease lapse (manage); on, or the account's default, spends the balance
    (pay as well)."""
    lease = customer_lease(request, lease_id)
    value = json_body(request).get("auto_renew", "missing")
    if value not in (True, False, None):
        raise field_errors({"auto_renew": [_("Give true, false or null (the account's default).")]})
    if value is not False:
        require_scope(request, "pay")
    if not lease_auto_renew_set(customer=request.api_user, lease_id=lease.pk, auto_renew=value):
        raise ApiError(409, "lease_ended", _("Lease #%(id)s has ended.") % {"id": lease.pk})
    lease.refresh_from_db()
    return JsonResponse(lease_json(lease, scopes=token_scopes(request)))


def ssh_key_json(key: SshKey) -> dict:
    return {"id": key.pk, "name": key.name, "fingerprint": key.fingerprint, "public_key": key.public_key,
            "created_at": iso(key.created_at)}


@api_endpoint("GET", "POST", scope={"GET": "read", "POST": "order"}, right={"GET": "view", "POST": "operate"})
def ssh_keys(request):
    """GET: the saved SSH keys; POST {"name", "public_key"} saves one."""
    if request.method == "GET":
        return JsonResponse({"keys": [ssh_key_json(k) for k in SshKey.objects.filter(customer=request.api_user)]})
    data = json_body(request)
    name, public_key = data.get("name", ""), data.get("public_key")
    if not isinstance(name, str) or not isinstance(public_key, str) or not public_key.strip():
        raise field_errors({"public_key": [_("Give the public key line, e.g. the contents of ~/.ssh/id_ed25519.pub.")]})
    try:
        key = ssh_key_add(customer=request.api_user, name=name, public_key=public_key)
    except SshKeyRefused as exc:
        raise ApiError(400, "invalid", str(exc), fields={"public_key": [str(exc)]}) from exc
    return JsonResponse(ssh_key_json(key), status=201)


@api_endpoint("DELETE", scope="order", right="operate")
def ssh_key_detail(request, key_id: int):
    if not ssh_key_delete(customer=request.api_user, key_id=key_id):
        raise Http404
    return JsonResponse({"deleted": key_id})


def volume_json(v: NetworkVolume) -> dict:
    return {"id": v.pk, "name": v.name, "site": v.site.code, "size_tb": v.size_tb, "state": v.state,
            "created_at": iso(v.created_at), "paid_until": iso(v.paid_until), "deleted_at": iso(v.deleted_at),
            "attached_to": [a.lease_id for a in v.attachments.all() if a.detached_at is None]}


def snapshot_json(s: Snapshot) -> dict:
    return {"id": s.pk, "lease": s.source_lease_id, "region": s.region, "site": s.site.code if s.site_id else None,
            "size_tb": s.size_tb, "state": s.state, "created_at": iso(s.created_at),
            "paid_until": iso(s.paid_until), "deleted_at": iso(s.deleted_at)}


def volumes_list(request) -> JsonResponse:
    """GET /api/v1/volumes (storage.api adds POST: ordering one)."""
    rows = (NetworkVolume.objects.filter(customer=request.api_user).select_related("site")
            .prefetch_related("attachments")[:200])
    return JsonResponse({"volumes": [volume_json(v) for v in rows]})


def snapshots_list(request) -> JsonResponse:
    """GET /api/v1/snapshots (storage.api adds POST: taking one)."""
    rows = Snapshot.objects.filter(customer=request.api_user).select_related("site")[:200]
    return JsonResponse({"snapshots": [snapshot_json(s) for s in rows]})


@api_endpoint("GET", scope=PUBLIC)
def sites(request):
    """The sites one can order at, with their region (the codes `site` takes)."""
    return JsonResponse({"sites": [{"code": site.code, "name": site.name, "region": site.region}
                                   for site in Site.objects.filter(is_active=True).order_by("code")]})


@api_endpoint("GET", scope=PUBLIC)
def images(request):
    """The images one can order, per vendor (the slugs `image` takes)."""
    rows = Image.objects.filter(is_active=True).order_by("vendor", "slug")
    return JsonResponse({"images": [{"slug": image.slug, "name": image.name, "vendor": image.vendor,
                                     # a template's own image, command and ports (rental.workbench)
                                     "image_ref": image.image_ref or None, "start_command": image.start_command,
                                     "ports": list(image.ports), "description": image.description,
                                     "generated_secret": image.generated_secret or None}
                                    for image in rows]})


@api_endpoint("GET", "POST", "PUT", "PATCH", "DELETE", scope=PUBLIC)
def not_found(request, rest: str = ""):
    return error_response(404, "not_found", _("No such API endpoint."))


def rate_limited(view):
    """The API's per-address limit (API_REQUESTS_PER_IP_PER_MINUTE, JSON 429 with
    Retry-After) for a public view outside api_endpoint: settings.SIZING_API_GUARD wraps
    /api/v1/estimate with it (sizing sits below rental and cannot import it)."""
    @wraps(view)
    def guarded(request, *args, **kwargs):
        if not _within_rate(request, "api-address", "API_REQUESTS_PER_IP_PER_MINUTE"):
            return _too_many("API_REQUESTS_PER_IP_PER_MINUTE")
        return view(request, *args, **kwargs)
    return guarded
