"""``/api/v1/estimate``: stateless JSON sizing.

GET: every input as a query parameter. POST: the raw body is a Hugging Face config.json,
the other inputs are query parameters. Bad input → 400 naming the field; body over 64 KB
→ 413; other methods → 405. Never 500 for anything a client sends.
"""

from __future__ import annotations

import json

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse
from django.utils.translation import get_language
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt

from . import SizingInputError
from .memo import Memo
from .results import candidates, catalog_key, run, to_json, to_json_text

MAX_BODY_BYTES = 64 * 1024
ALLOWED = ("GET", "POST")


def _error(status: int, error: str, message: str, field: str | None = None) -> JsonResponse:
    body = {"error": error, "message": message}
    if field is not None:
        body["field"] = field
    return JsonResponse(body, status=status)


def _invalid(exc: SizingInputError) -> JsonResponse:
    return _error(400, "invalid", exc.message, exc.field)


def _body_config(request):
    """The POSTed config.json as a dict; raises SizingInputError or RequestDataTooBig."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestDataTooBig
    body = request.body
    if len(body) > MAX_BODY_BYTES:
        raise RequestDataTooBig
    if not body.strip():
        raise SizingInputError("config", _("POST a config.json as the request body"))
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise SizingInputError("config", _("is not valid JSON")) from None
    if not isinstance(data, dict):
        raise SizingInputError("config", _("must be a JSON object"))
    return data


def _params(request) -> dict:
    params = request.GET.dict()
    if request.method == "POST":
        params["config"] = _body_config(request)
    return params


# GET answers are a pure function of (query, language, candidates): keep the last few per
# process (the candidates are in the key, so a stock change is a new key). bench/load.py.
_MEMO = Memo(max_entries=256)


def _get_json(params: dict, cands, language: str | None = None) -> bytes:
    key = (tuple(sorted(params.items())), language or get_language(), catalog_key(cands))
    return _MEMO.get(key, lambda: to_json_text(run(params, cands)).encode())


@csrf_exempt
def estimate(request):
    if request.method not in ALLOWED:
        response = _error(405, "method_not_allowed", _("Use GET or POST."))
        response["Allow"] = ", ".join(ALLOWED)
        return response
    try:
        if request.method == "GET":
            return HttpResponse(_get_json(request.GET.dict(), candidates(), getattr(request, "LANGUAGE_CODE", None)),
                                content_type="application/json")
        result = run(_params(request), candidates())
    except SizingInputError as exc:
        return _invalid(exc)
    except RequestDataTooBig:
        return _error(413, "too_large", _("The body may be at most 64 KB."), "config")
    return JsonResponse(to_json(result))


# Every /api/v1 route declares its scope per method (rental.api.api_endpoint keeps them the
# same way); sizing sits below rental, so this public endpoint states it by hand.
estimate.api_scopes = {"GET": None, "POST": None}
estimate.api_also = {}
