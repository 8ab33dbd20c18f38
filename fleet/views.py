"""The node agent's API (PROTOCOL.md): enrol, desired state, signed reports. Token auth
(`Authorization: Node <credential>`), so CSRF-exempt; every answer is JSON, and bad input
is a 4xx with {"error": code}, never a 500."""
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponseNotModified, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from rental.accounts.throttle import throttle_take

from .desired import desired_answer
from .desired_version import current_etag
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


def _rate_limited(request, *, scope: str, limit: int, key: str | None = None) -> JsonResponse | None:
    """Issue 28: the agents' API is rate limited — enrolment and unauthenticated calls per
    client address, a node's calls per credential — with a JSON 429 the agent retries."""
    if throttle_take(scope, request, limit=limit, window_seconds=60, key=key):
        return None
    response = _error(429, "rate_limited")
    response["Retry-After"] = "60"
    return response


def _agent_or_refusal(request) -> tuple[NodeAgent | None, JsonResponse | None]:
    agent = _authenticated(request)
    if agent is None:
        return None, (_rate_limited(request, scope="node-unauthorized",
                                    limit=settings.NODE_ENROLMENTS_PER_IP_PER_MINUTE) or _error(401, "unauthorized"))
    # Never below what the poll interval the server gives asks for (desired + report, and
    # retries): 4 calls per interval.
    limit = max(settings.NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE, 4 * 60 // max(1, settings.NODE_POLL_SECONDS))
    return agent, _rate_limited(request, scope="node-requests", key=f"node:{agent.pk}", limit=limit)


def _text(data: dict, key: str, max_len: int) -> str:
    value = data.get(key, "")
    return value[:max_len] if isinstance(value, str) else ""


@csrf_exempt
@require_POST
def enrol(request):
    limited = _rate_limited(request, scope="node-enrol", limit=settings.NODE_ENROLMENTS_PER_IP_PER_MINUTE)
    if limited:
        return limited
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
    agent, refusal = _agent_or_refusal(request)
    if refusal:
        return refusal
    now = timezone.now()
    _seen(agent, now)
    asked = {t.strip() for t in request.headers.get("If-None-Match", "").split(",") if t.strip()}
    etag = current_etag(agent.node_id, now) if asked else None
    if etag is not None and etag in asked:
        response = HttpResponseNotModified()      # issue 31: decided from the cache, no query
    else:
        document, etag = desired_answer(node=agent.node, now=now)
        response = HttpResponseNotModified() if etag in asked else JsonResponse(document)
    response["ETag"] = etag
    return response


def _seen(agent: NodeAgent, now) -> None:
    """The heartbeat of a desired poll, written only when the stored one is older than
    NODE_SEEN_WRITE_SECONDS (issue 31: a steady poll writes nothing; reports write it)."""
    if agent.last_seen_at is None or (now - agent.last_seen_at).total_seconds() >= settings.NODE_SEEN_WRITE_SECONDS:
        NodeAgent.objects.filter(pk=agent.pk).update(last_seen_at=now)


def _with_desired(payload: dict, agent: NodeAgent, held_etag: str, now) -> dict:
    """Issue 31: a report that says which desired state the agent holds (`desired_etag`) is
    answered with the current one (`desired`: the document, or null when it is the one held),
    so a steady node makes one request per poll."""
    etag = current_etag(agent.node_id, now)
    if etag is None or etag != held_etag:
        document, etag = desired_answer(node=agent.node, now=now)
    payload["desired"] = None if etag == held_etag else document
    payload["desired_etag"] = etag
    return payload


@csrf_exempt
@require_POST
def report(request):
    agent, refusal = _agent_or_refusal(request)
    if refusal:
        return refusal
    body = _body(request)
    if body is None:
        return _error(413, "too_large")
    try:
        now = timezone.now()
        outcome = report_accept(agent=agent, body=body, signature=request.headers.get("X-Node-Signature", ""),
                                now=now)
    except ReportRefused as exc:
        return _error(exc.status, exc.code)
    payload = outcome.as_json()
    if outcome.desired_etag is not None:
        payload = _with_desired(payload, agent, outcome.desired_etag, now)
    return JsonResponse(payload)
