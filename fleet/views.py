"""The node agent's API (PROTOCOL.md): enrol, desired state, signed reports. Token auth
(`Authorization: Node <credential>`), so CSRF-exempt; every answer is JSON, and bad input
is a 4xx with {"error": code}, never a 500."""
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .desired import desired_document
from .jsonbody import parse_json
from .models import NodeAgent
from .reports import ReportRefused, report_accept
from .services import EnrolmentRefused, node_enrol, node_for_credential


def _error(status: int, code: str) -> JsonResponse:
    return JsonResponse({"error": code}, status=status)


def _body(request) -> bytes | None:
    try:
        return request.body
    except RequestDataTooBig:
        return None


def _authenticated(request) -> NodeAgent | None:
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Node":
        return None
    return node_for_credential(credential.strip())


def _text(data: dict, key: str, max_len: int) -> str:
    value = data.get(key, "")
    return value[:max_len] if isinstance(value, str) else ""


@csrf_exempt
@require_POST
def enrol(request):
    body = _body(request)
    if body is None:
        return _error(413, "too_large")
    try:
        data = parse_json(body)
    except ValueError:
        return _error(400, "invalid_json")
    if not isinstance(data, dict) or not isinstance(data.get("code"), str) or not isinstance(
            data.get("public_key"), str):
        return _error(400, "invalid_request")
    try:
        enrolment = node_enrol(code=data["code"][:200], public_key=data["public_key"],
                               agent_version=_text(data, "agent_version", 40), hostname=_text(data, "hostname", 120),
                               now=timezone.now())
    except ValueError:
        return _error(400, "invalid_public_key")
    except EnrolmentRefused:
        return _error(403, "enrolment_refused")
    return JsonResponse({"node": enrolment.node.name, "credential": enrolment.credential,
                         "poll_seconds": settings.NODE_POLL_SECONDS})


@csrf_exempt
@require_GET
def desired(request):
    agent = _authenticated(request)
    if agent is None:
        return _error(401, "unauthorized")
    now = timezone.now()
    NodeAgent.objects.filter(pk=agent.pk).update(last_seen_at=now)
    return JsonResponse(desired_document(node=agent.node, now=now))


@csrf_exempt
@require_POST
def report(request):
    agent = _authenticated(request)
    if agent is None:
        return _error(401, "unauthorized")
    body = _body(request)
    if body is None:
        return _error(413, "too_large")
    try:
        outcome = report_accept(agent=agent, body=body, signature=request.headers.get("X-Node-Signature", ""),
                                now=timezone.now())
    except ReportRefused as exc:
        return _error(exc.status, exc.code)
    return JsonResponse(outcome.as_json())
