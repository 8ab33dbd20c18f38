"""The node agent's API (PROTOCOL.md): enrol, desired state, signed reports. Token auth
(`Authorization: Node <credential>`), so CSRF-exempt; every answer is JSON, and bad input
is a 4xx with {"error": code}, never a 500."""
import asyncio
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import HttpResponseNotModified, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from rental.accounts.throttle import throttle_counter, throttle_take, throttle_take_reading

from . import credentials, desired_watch
from .desired import desired_answer
from .desired_version import (
    EPOCH_KEY,
    REDIS_RUN,
    changes_so_far,
    current_etag,
    desired_stamp,
    etag_keys,
    version_key,
)
from .desired_watch import version_token
from .jsonbody import parse_json
from .middleware import skip_health_checks
from .models import NodeAgent
from .pacing import poll_seconds
from .reports import Envelope, ReportRefused, report_accept, report_envelope
from .seq import seq_take_polled
from .services import EnrolmentRefused, node_enrol
from .steady import reports_key


def _error(status: int, code: str) -> JsonResponse:
    return JsonResponse({"error": code}, status=status)


def _body(request) -> bytes | None:
    try:
        return request.body
    except RequestDataTooBig:
        return None


def _credential_hash(request) -> str | None:
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    return credentials.credential_hash_of(credential) if scheme == "Node" else None


def _rate_limited(request, *, scope: str, limit: int, key: str | None = None) -> JsonResponse | None:
    """The agents' API is rate limited — enrolment and unauthenticated calls per
    client address, a node's calls per credential — with a JSON 429 the agent retries."""
    return None if throttle_take(scope, request, limit=limit, window_seconds=60, key=key) else _too_many()


def _too_many() -> JsonResponse:
    response = _error(429, "rate_limited")
    response["Retry-After"] = "60"
    return response


def _request_limit() -> int:
    # Never below what the poll interval the server gives asks for (desired + report, and
    # retries): 4 calls per interval.
    return max(settings.NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE, 4 * 60 // max(1, settings.NODE_POLL_SECONDS))


def _unauthorized(request) -> JsonResponse:
    return _rate_limited(request, scope="node-unauthorized",
                         limit=settings.NODE_ENROLMENTS_PER_IP_PER_MINUTE) or _error(401, "unauthorized")


def _report_keys(node_id: int) -> tuple[str, ...]:
    return (*etag_keys(node_id), reports_key(node_id))


def _agent_or_refusal(request, *, checked_by_caller: bool, keys_of=etag_keys
                      ) -> tuple[NodeAgent | None, dict, JsonResponse | None]:
    """The calling agent (fleet/credentials.py), its call counted against the node's rate
    limit, and the cache keys a poll needs (the credential epoch, the node's `keys_of`) —
    for an agent this worker has seen, all in one cache round trip."""
    credential_hash = _credential_hash(request)
    if credential_hash is None:
        return None, {}, _unauthorized(request)
    seen = credentials.cached_ids(credential_hash)
    read = (credentials.EPOCH_KEY, *(keys_of(seen[1]) if seen else ()))
    if seen:
        allowed, found = throttle_take_reading("node-requests", request, limit=_request_limit(), window_seconds=60,
                                               key=f"node:{seen[0]}", read=read)
    else:
        allowed, found = True, cache.get_many(read)
    agent = credentials.cached_agent(credential_hash, epoch=credentials.current_epoch(found),
                                     checked_by_caller=checked_by_caller)
    if agent is None:
        return None, {}, _unauthorized(request)
    if seen != (agent.pk, agent.node_id):        # looked up now: counted and read now
        allowed, found = throttle_take_reading("node-requests", request, limit=_request_limit(), window_seconds=60,
                                               key=f"node:{agent.pk}", read=keys_of(agent.node_id))
    if not allowed:
        return None, {}, _too_many()
    return agent, found, None


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
                         "poll_seconds": poll_seconds(timezone.now())})


@csrf_exempt
@require_GET
def desired(request):
    agent, found, refusal = _agent_or_refusal(request, checked_by_caller=False)
    if refusal:
        return refusal
    now = timezone.now()
    _seen(agent, now)
    version = _version_of(agent.node_id, found)
    asked = {t.strip() for t in request.headers.get("If-None-Match", "").split(",") if t.strip()}
    etag = current_etag(agent.node_id, now, found=found) if asked else None
    if etag is not None and etag in asked:
        response = HttpResponseNotModified()      # decided from the cache, no query
    else:
        document, etag = desired_answer(node=agent.node, now=now)
        response = HttpResponseNotModified() if etag in asked else JsonResponse(document)
    response["ETag"] = etag
    response[VERSION_HEADER] = version
    return response


#: The desired-state version the answer's document is at least as new as (read before the
#: document was built): what the node gives GET /agent/v1/desired/watch (desired_watch.py).
VERSION_HEADER = "X-Desired-Version"


def _version_of(node_id: int, found: dict | None) -> str:
    """The node's version token as this request's round trip read it, else read now (created
    when missing); "" without a cache."""
    if found is not None and EPOCH_KEY in found and version_key(node_id) in found:
        return version_token((found[EPOCH_KEY], found[version_key(node_id)]))
    return version_token(desired_stamp(node_id))


def _watching_agent(request, fresh_connections: bool) -> tuple[NodeAgent | None, dict, JsonResponse | None]:
    """The watch's one trip to a thread: a connection the database dropped closed first when
    the caller asks (fleet/asgi.py, outside Django's request signals), then the caller."""
    if fresh_connections:
        _fresh_connections()
    return _agent_or_refusal(request, checked_by_caller=False)


def _fresh_connections() -> None:
    """What Django's request signals and the agent API's middleware would do at the start of
    a call the ASGI process serves without them (fleet/asgi.py): a connection the database
    dropped closed, no health check query."""
    close_old_connections()
    skip_health_checks()


async def watch(request, *, fresh_connections: bool = False):
    """GET /agent/v1/desired/watch?version=V&wait=S (PROTOCOL.md): answered as soon as the
    node's desired-state version differs from V, or after S seconds (at most
    NODE_WATCH_MAX_SECONDS) with `changed: false`. Counted against the node's rate limit like
    any call; it reads no table, and waits without a thread only under ASGI."""
    asked = _watch_query(request, "GET")
    if isinstance(asked, JsonResponse):
        return asked
    given, hold = asked
    read_at = time.monotonic()
    # one thread hop, not two: each is a pool round trip (and a context copy) per watch
    agent, found, refusal = await sync_to_async(_watching_agent)(request, fresh_connections)
    if refusal:
        return refusal
    # the version as the call's own round trip read it (else read once registered)
    current = _version_of(agent.node_id, found) if EPOCH_KEY in found and version_key(agent.node_id) in found \
        else None
    node_id = agent.node_id
    del request, agent, found        # not kept while it waits (below)
    return _watched(await _changed_from(node_id, given, current, hold, read_at), given)


# The two waits are exempt as csrf_exempt marks a view, without its wrapper: a wrapping
# coroutine's frame would keep the request for the whole wait. What a waiting call keeps costs
# memory and is walked by every full collection of the watch process, thousands of times over,
# so the waits drop what they no longer need (docs/adr/0030-*).
watch.csrf_exempt = True  # type: ignore[attr-defined]


def _watch_query(request, method: str) -> tuple[str, float] | JsonResponse:
    """The version a waiting call holds and how long it may be held (its `wait`, at most
    NODE_WATCH_MAX_SECONDS; under WSGI, where a wait would park a server thread,
    NODE_WATCH_WSGI_HOLD_SECONDS); the 4xx for another method or bad input."""
    if request.method != method:
        return _error(405, "method_not_allowed")
    try:
        wait = float(request.GET.get("wait", settings.NODE_POLL_SECONDS))
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or wait < 0:
        return _error(400, "invalid_request")
    hold = min(wait, settings.NODE_WATCH_MAX_SECONDS)
    if not isinstance(request, ASGIRequest):
        hold = min(hold, settings.NODE_WATCH_WSGI_HOLD_SECONDS)
    return request.GET.get("version", "")[:80], hold


async def _changed_from(node_id: int, given: str, current: str | None, hold: float, read_at: float) -> str:
    """The node's version as soon as it differs from `given`, else `hold` seconds after
    `read_at` the one it has. `current`: as the caller read it (None: read here, once registered, so a
    change between the read and the wait still rings); `read_at`: when (time.monotonic())
    the caller's read began."""
    desired_watch.ensure_listening()
    loop = asyncio.get_running_loop()
    # The wait counts from when the call came (read_at), not from when its trip to a thread
    # came back: a call queued there behind others (a burst of reports and new documents
    # after a lifecycle pass) is still answered when its node asked, not that much later.
    deadline = loop.time() + hold - (time.monotonic() - read_at)
    # Registered now, it is rung by any change heard since the version was read (read_at).
    with desired_watch.bell.waiter(node_id, read_at=read_at) as waiter:
        if current is None:
            current = await sync_to_async(_version_of)(node_id, None)
        while current and current == given and (remaining := deadline - loop.time()) > 0:
            # subscribed, every change rings; else the version is read again now and then
            subscribed = desired_watch.listening()
            timeout = remaining if subscribed else min(remaining, settings.NODE_WATCH_RECHECK_SECONDS)
            if not await waiter.rung(timeout):
                if subscribed and desired_watch.listening():
                    # Subscribed for the whole wait and not rung: no change came (a lost
                    # subscription rings every waiter). Reading it again would cost each
                    # held call a thread hop and a Redis round trip at its end.
                    return current
            elif waiter.news is not None:
                told = desired_watch.version_after(given, waiter.news)
                if told is not None:
                    return told      # a committed change: nothing to read
            waiter.news = None
            current = await sync_to_async(_version_of)(node_id, None)
    return current


def _watched(current: str, given: str) -> JsonResponse:
    """`changed`; `version` "" when there is no cache to watch (the node then just polls)."""
    return JsonResponse({"changed": bool(current) and current != given, "version": current})


def _seen(agent: NodeAgent, now) -> None:
    """The heartbeat of a desired poll, written only when the stored one is older than
    NODE_SEEN_WRITE_SECONDS (a steady poll writes nothing; reports write it)."""
    if agent.last_seen_at is None or (now - agent.last_seen_at).total_seconds() >= settings.NODE_SEEN_WRITE_SECONDS:
        NodeAgent.objects.filter(pk=agent.pk).update(last_seen_at=now)
        agent.last_seen_at = now
        credentials.remember(agent)


def _with_desired(payload: dict, agent: NodeAgent, held_etag: str, now, found: dict | None) -> dict:
    """A report that says which desired state the agent holds (`desired_etag`) is
    answered with the current one (`desired`: the document, or null when it is the one held),
    so a steady node makes one request per poll. `found`: the ETag keys as read before the
    report was applied, None when applying it moved a desired-state version."""
    etag = current_etag(agent.node_id, now, found=found)
    if etag is None or etag != held_etag:
        document, etag = desired_answer(node=agent.node, now=now, run=(found or {}).get(REDIS_RUN))
    payload["desired"] = None if etag == held_etag else document
    payload["desired_etag"] = etag
    return payload


def _polled_report(request, signature: str, now) -> tuple[NodeAgent, dict, Envelope] | JsonResponse | None:
    """The report of an agent this worker knows, in one Redis round trip: its
    signature checked with the cached key first, then the call counted against the node's
    rate limit, the poll's keys read and the seq taken, together (fleet/seq.py). None: the
    usual path decides (no entry, a body that does not check out with it, no Redis)."""
    credential_hash = _credential_hash(request)
    cached = credentials.cached_unchecked(credential_hash) if credential_hash else None
    body = _body(request) if cached and cached[1] is not None else None
    if body is None:
        return None
    agent, epoch = cached
    try:
        envelope = report_envelope(agent, body, signature, now)
    except ReportRefused:
        return None                         # refused on the usual path, counted like any call
    limit = _request_limit()
    polled = seq_take_polled(agent, envelope.data["seq"], envelope.facts, now, limit=limit, window_seconds=60,
                             counter=throttle_counter("node-requests", request, key=f"node:{agent.pk}"),
                             read=(credentials.EPOCH_KEY, *_report_keys(agent.node_id)), epoch=epoch)
    if polled is None:
        return None
    if polled.count > limit:
        return _too_many()
    if polled.verdict is None:              # counted and read; the credential epoch moved since
        return _looked_up(request, credential_hash, polled.found, agent.node_id, body, signature, now)
    envelope.verdict = polled.verdict
    return agent, {**polled.found, REDIS_RUN: polled.run}, envelope


def _looked_up(request, credential_hash: str, found: dict, node_id: int, body: bytes, signature: str, now
               ) -> tuple[NodeAgent, dict, Envelope] | JsonResponse:
    agent = credentials.cached_agent(credential_hash, epoch=credentials.current_epoch(found))
    if agent is None:
        return _unauthorized(request)
    if agent.node_id != node_id:
        found = cache.get_many(_report_keys(agent.node_id))
    try:
        return agent, found, report_envelope(agent, body, signature, now)
    except ReportRefused as exc:
        return _error(exc.status, exc.code)


@csrf_exempt
@require_POST
def report(request):
    return _report(request)[0]


@dataclass
class _Steady:
    """A report's answer that told the node its desired state is current: what a held report
    (report_watch) needs to answer again once it moves."""
    agent: NodeAgent
    payload: dict
    held_etag: str
    version: str


def _report(request) -> tuple[JsonResponse, _Steady | None]:
    # A steady report may be accepted by Redis alone (fleet/seq.py): the cached agent serves
    # only under the current credential epoch, as for a desired poll.
    now, signature, envelope = timezone.now(), request.headers.get("X-Node-Signature", ""), None
    polled = _polled_report(request, signature, now)
    if isinstance(polled, JsonResponse):
        return polled, None
    if polled:
        agent, found, envelope = polled
    else:
        agent, found, refusal = _agent_or_refusal(request, checked_by_caller=False, keys_of=_report_keys)
        if refusal:
            return refusal, None
    body = _body(request)
    if body is None:
        return _error(413, "too_large"), None
    changes = changes_so_far()
    try:
        outcome = report_accept(agent=agent, body=body, signature=signature, now=now, cached=found,
                                envelope=envelope)
    except ReportRefused as exc:
        return _error(exc.status, exc.code), None
    payload = outcome.as_json()
    version, steady = None, None
    if outcome.desired_etag is not None:
        unmoved = found if changes_so_far() == changes else None
        version = _version_of(agent.node_id, unmoved)
        payload = _with_desired(payload, agent, outcome.desired_etag, now, unmoved)
        if payload["desired"] is None:
            steady = _Steady(agent, payload, outcome.desired_etag, version)
    response = JsonResponse(payload)
    if version is not None:
        response[VERSION_HEADER] = version
    return response, steady


def _report_in_thread(request, fresh_connections: bool) -> tuple[JsonResponse, _Steady | None]:
    if fresh_connections:
        _fresh_connections()
    return _report(request)


_report_threads: ThreadPoolExecutor | None = None
_report_threads_made = threading.Lock()


def report_threads() -> ThreadPoolExecutor:
    """The threads (NODE_WATCH_REPORT_THREADS) on which the ASGI process takes the reports that
    wait, made in the process that serves them (a server's worker, after its fork)."""
    global _report_threads
    with _report_threads_made:
        if _report_threads is None:
            _report_threads = ThreadPoolExecutor(settings.NODE_WATCH_REPORT_THREADS, thread_name_prefix="node-report")
        return _report_threads


def _answer_again(steady: _Steady) -> JsonResponse:
    """A held report's answer once its node's desired state moved: the report's own answer
    with the current document (the version read first: the document is at least as new)."""
    version = _version_of(steady.agent.node_id, None)
    payload = _with_desired(dict(steady.payload), steady.agent, steady.held_etag, timezone.now(), None)
    response = JsonResponse(payload)
    response[VERSION_HEADER] = version
    return response


async def report_watch(request, *, fresh_connections: bool = False):
    """POST /agent/v1/report/watch?version=V&wait=S (PROTOCOL.md): the report, accepted at
    once as POST /agent/v1/report; when its answer says the node holds its current desired
    state and that state is at version V, the answer is held until the state moves past V
    (then it carries the new document) or for S seconds. A node's report and its wait for a
    change are one request: half the requests of a report and a watch."""
    asked = _watch_query(request, "POST")
    if isinstance(asked, JsonResponse):
        return asked
    given, hold = asked
    read_at = time.monotonic()
    # Under ASGI (the watch process) the reports' own threads (report_threads), not the one
    # thread every thread-sensitive call shares: a report does more than a watch. Under WSGI
    # the server's own thread, whose connection is kept: a new event loop's pool would open
    # one per call.
    threads_of_pool = isinstance(request, ASGIRequest)
    take = sync_to_async(_report_in_thread, thread_sensitive=False, executor=report_threads()) if threads_of_pool \
        else sync_to_async(_report_in_thread, thread_sensitive=True)
    response, steady = await take(request, fresh_connections)
    if steady is None or not given or steady.version != given or hold <= 0:
        return response
    del request, take                # not kept while it waits (see watch)
    if await _changed_from(steady.agent.node_id, given, steady.version, hold, read_at) == given:
        return response
    return await sync_to_async(_answer_again, thread_sensitive=not threads_of_pool)(steady)


report_watch.csrf_exempt = True  # type: ignore[attr-defined]  # as watch is
