"""The nodes' waits as the ASGI process answers them (fleet/asgi.py): the headers are the
view's own, then those the middleware stack would add, in the order Django's setdefault would
put them, and the body the view's; a held report's body is read as sent, up to Django's limit."""
import asyncio
import gc
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import JsonResponse

from fleet import asgi, desired_watch, views
from fleet.middleware import fixed_headers

from .conftest import node_of
from .waits import in_a_pool_of_one, until_it_waits

pytestmark = pytest.mark.django_db(transaction=True)


def scope_of(method: str, query: str, credential: str | None, *, path: str = asgi.WATCH_PATH,
             headers: tuple = ()) -> dict:
    headers = [(b"host", b"127.0.0.1"), *headers]
    if credential is not None:
        headers.append((b"authorization", f"Node {credential}".encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query.encode(),
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}


def headers_as_before(response) -> list[tuple[bytes, bytes]]:
    """What the ASGI app sent before its headers were encoded once: setdefault, then items."""
    for name, value in {**fixed_headers(), "Permissions-Policy": settings.PERMISSIONS_POLICY,
                        "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}.items():
        response.setdefault(name, value)
    headers = [(name.encode("latin-1"), str(value).encode("latin-1")) for name, value in response.items()]
    return [*headers, (b"content-length", str(len(response.content)).encode())]


def served(scope: dict, chunks: list[bytes] | None = None, *, while_held=None) -> tuple[int, list, bytes]:
    """`chunks`: the body as sent (the list is consumed as the app reads it); `while_held`:
    called on the app's loop once the call waits on the bell."""
    sent, parts = [], chunks if chunks is not None else [b""]

    async def receive():
        body = parts.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(parts)}

    async def send(message):
        sent.append(message)

    async def answered():
        answer = asyncio.ensure_future(asgi.watch_app(scope, receive, send))
        if while_held is not None:
            await until_it_waits(answer, lambda: f"it never waited: {sent}")
            while_held(answer)
        await answer

    async def served_in_a_pool():
        await in_a_pool_of_one(answered())

    def run():          # in a thread of its own, as a server runs it (no event loop left here)
        try:
            async_to_sync(served_in_a_pool)()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()
    start, body = sent
    return start["status"], start["headers"], body["body"]


@pytest.mark.parametrize("method, query, with_credential, status", [
    ("GET", "version=behind&wait=5", True, 200),
    ("GET", "version=x&wait=soon", True, 400),
    ("POST", "version=x", True, 405),
    ("GET", "version=x", False, 401),
])
def test_an_answer_carries_the_headers_and_body_it_did_before(paid_lease, enrol, method, query, with_credential,
                                                               status):
    node = enrol(node_of(paid_lease()))
    status_sent, headers, body = served(scope_of(method, query, node.credential if with_credential else None))
    assert status_sent == status
    if status == 200:
        assert json.loads(body)["changed"] is True
    expected = JsonResponse(json.loads(body), status=status)
    assert (headers, body) == (headers_as_before(expected), expected.content)


def test_a_failure_is_a_503_with_retry_after_and_the_same_headers(monkeypatch):
    async def broken(request, **kwargs):
        raise RuntimeError("redis and the database both gone")

    monkeypatch.setattr(views, "watch", broken)
    status, headers, body = served(scope_of("GET", "version=x", "anything"))
    expected = JsonResponse({"error": "unavailable"}, status=503)
    expected["Retry-After"] = "5"
    assert (status, headers, body) == (503, headers_as_before(expected), expected.content)
    assert (b"Retry-After", b"5") in headers and (b"Cache-Control", b"no-store") in headers


def test_a_held_report_is_read_from_every_chunk_sent(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    body = node.body(desired_etag="")
    signed = ((b"x-node-signature", node.sign(body).encode()), (b"content-type", b"application/json"),
              (b"content-length", str(len(body)).encode()))
    status, headers, answer = served(scope_of("POST", "version=x&wait=5", node.credential,
                                              path=asgi.REPORT_WATCH_PATH, headers=signed),
                                     chunks=[body[:10], body[10:40], body[40:]])
    assert status == 200, answer
    assert json.loads(answer)["desired"] is not None        # it held no document: answered at once
    expected = JsonResponse(json.loads(answer))
    expected[views.VERSION_HEADER] = dict(headers)[views.VERSION_HEADER.encode()].decode()
    assert (headers, answer) == (headers_as_before(expected), expected.content)


def test_a_body_past_the_limit_is_a_413_read_no_further(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    chunks = [b"{" + b" " * (limit // 2), b" " * (limit // 2), b" " * 10, b"}"]
    status, _, answer = served(scope_of("POST", "version=x&wait=5", node.credential, path=asgi.REPORT_WATCH_PATH),
                               chunks=chunks)
    assert (status, json.loads(answer)) == (413, {"error": "too_large"})
    assert chunks == [b" " * 10, b"}"]     # the chunk that passed the limit was the last one read


def test_a_held_report_keeps_neither_its_request_nor_a_task_of_its_own_while_it_waits(paid_lease, enrol, settings):
    """Thousands of nodes wait in one process, and its every full collection walks all that
    each wait keeps (a pause of its event loop as long): while a report is held, its request
    (headers, body, the parsed query) is gone and the time limit is a timer, not a task."""
    settings.NODE_WATCH_RECHECK_SECONDS = 60      # subscribed or not, it waits on the bell
    node = enrol(node_of(paid_lease()))
    document = node.desired()
    body = node.body(desired_etag=document["ETag"])
    signed = ((b"x-node-signature", node.sign(body).encode()), (b"content-type", b"application/json"))
    kept = {}

    def requests_alive() -> int:      # an earlier test in this worker may have left some
        gc.collect()
        # type(), not isinstance(): that asks a lazy object left by an earlier test (a CSP
        # nonce) for its __class__, which evaluates it
        return sum(type(o) is ASGIRequest for o in gc.get_objects())

    before = requests_alive()

    def look(answer):
        kept["requests"] = requests_alive() - before
        kept["tasks"] = asyncio.all_tasks() - {asyncio.current_task(), answer}
        desired_watch.bell.ring(desired_watch.EVERY_NODE, ("epoch", "moved"))      # answered now, not in 30 s

    status, _, answer = served(scope_of("POST", f"version={document[views.VERSION_HEADER]}&wait=30", node.credential,
                                        path=asgi.REPORT_WATCH_PATH, headers=signed), [body], while_held=look)
    assert status == 200 and json.loads(answer)["refused"] == []
    assert kept == {"requests": 0, "tasks": set()}
