"""The workbench in the JSON API (rental.workbench): the account's registry credentials and
variables, the lease's workbench as the API shows it, and the 400 a refused input gets. A
secret or a password is accepted, never returned: replies name them only."""
from django.http import Http404, JsonResponse
from django.utils import timezone
from django.utils.translation import gettext as _

from .api import ApiError, api_endpoint, field_errors, iso, json_body
from .models import AccountVariable, RegistryCredential
from .workbench import (
    account_variable_delete,
    account_variable_set,
    registry_credential_delete,
    registry_credential_save,
    workbench_json,  # noqa: F401 - re-exported for fleet.workbench_api
)
from .workbench_rules import WorkbenchRefused


def refused(exc: WorkbenchRefused) -> ApiError:
    """400 with the first problem's code as `error`, every message by field in `fields` and
    every code by field in `codes`."""
    return ApiError(400, exc.code, str(exc.problems[0].message), fields=exc.by_field(), codes=exc.codes())


WORKBENCH_FIELDS = ("image_ref", "registry_credential", "start_command", "env", "secrets", "ports")


def order_workbench_args(data: dict) -> dict:
    """The order body's workbench fields as rental.workbench.workbench_for_order's arguments
    (their values are checked there); absent fields are the template's defaults."""
    out = {}
    if "image_ref" in data:
        if data["image_ref"] is not None and not isinstance(data["image_ref"], str):
            raise field_errors({"image_ref": [_("Give the image reference as text.")]})
        out["image_ref"] = data["image_ref"] or ""
    if data.get("registry_credential") is not None:
        if not isinstance(data["registry_credential"], str | int) or isinstance(data["registry_credential"], bool):
            raise field_errors({"registry_credential": [_("Give the credential's name or id.")]})
        out["registry_credential"] = data["registry_credential"]
    if data.get("start_command") is not None:
        out["start_command"] = data["start_command"]
    for name in ("env", "secrets", "ports"):
        if data.get(name) is not None:
            out[name] = data[name]
    return out


# --- the account's registry credentials ---------------------------------------------------------

def credential_json(row: RegistryCredential) -> dict:
    return {"id": row.pk, "name": row.name, "server": row.server, "username": row.username,
            "created_at": iso(row.created_at), "updated_at": iso(row.updated_at)}


@api_endpoint("GET", "POST", scope={"GET": "read", "POST": "order"}, right={"GET": "view", "POST": "operate"})
def registry_credentials(request):
    """GET: the account's registry credentials (no passwords); POST {"name", "server",
    "username", "password"} saves one (the same name replaces it)."""
    if request.method == "GET":
        rows = RegistryCredential.objects.filter(customer=request.api_user)
        return JsonResponse({"registry_credentials": [credential_json(r) for r in rows]})
    data = json_body(request)
    try:
        row = registry_credential_save(customer=request.api_user, name=_text(data, "name"),
                                       server=_text(data, "server"), username=_text(data, "username"),
                                       password=data.get("password"), now=timezone.now())
    except WorkbenchRefused as exc:
        raise refused(exc) from exc
    return JsonResponse(credential_json(row), status=201)


@api_endpoint("DELETE", scope="order", right="operate")
def registry_credential_detail(request, credential_id: int):
    try:
        if not registry_credential_delete(customer=request.api_user, credential_id=credential_id, now=timezone.now()):
            raise Http404
    except WorkbenchRefused as exc:
        raise ApiError(409, exc.code, str(exc)) from exc
    return JsonResponse({"deleted": credential_id})


# --- the account's variables and secrets ----------------------------------------------------------

def variable_json(row: AccountVariable) -> dict:
    return {"name": row.name, "secret": row.secret, **({} if row.secret else {"value": row.value}),
            "updated_at": iso(row.updated_at)}


@api_endpoint("GET", "POST", scope={"GET": "read", "POST": "order"}, right={"GET": "view", "POST": "operate"})
def account_variables(request):
    """GET: the account's variables (secrets by name only); POST {"name", "value", "secret"}
    saves one (the same name replaces it). Leases ordered from then on get them."""
    if request.method == "GET":
        rows = AccountVariable.objects.filter(customer=request.api_user)
        return JsonResponse({"variables": [variable_json(r) for r in rows]})
    data = json_body(request)
    secret = data.get("secret", False)
    if not isinstance(secret, bool):
        raise field_errors({"secret": [_("Give true or false.")]})
    try:
        row = account_variable_set(customer=request.api_user, name=_text(data, "name"), value=data.get("value"),
                                   secret=secret, now=timezone.now())
    except WorkbenchRefused as exc:
        raise refused(exc) from exc
    return JsonResponse(variable_json(row), status=201)


@api_endpoint("DELETE", scope="order", right="operate")
def account_variable_detail(request, name: str):
    row = AccountVariable.objects.filter(customer=request.api_user, name=name).first()
    if row is None or not account_variable_delete(customer=request.api_user, variable_id=row.pk, now=timezone.now()):
        raise Http404
    return JsonResponse({"deleted": name})


def _text(data: dict, name: str) -> str:
    value = data.get(name, "")
    if not isinstance(value, str):
        raise field_errors({name: [_("Give %(name)s as text.") % {"name": name}]})
    return value
