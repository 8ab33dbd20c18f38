"""The watch as the ASGI process answers it (fleet/asgi.py): its headers are the view's own,
then those the middleware stack would add, in the order Django's setdefault would put them,
and its body the view's."""
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connections
from django.http import JsonResponse

from fleet import asgi, views
from fleet.middleware import fixed_headers

from .conftest import node_of

pytestmark = pytest.mark.django_db(transaction=True)


def scope_of(method: str, query: str, credential: str | None) -> dict:
    headers = [(b"host", b"127.0.0.1")]
    if credential is not None:
        headers.append((b"authorization", f"Node {credential}".encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": asgi.WATCH_PATH, "raw_path": asgi.WATCH_PATH.encode(), "query_string": query.encode(),
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}


def headers_as_before(response) -> list[tuple[bytes, bytes]]:
    """What the ASGI app sent before its headers were encoded once: setdefault, then items."""
    for name, value in {**fixed_headers(), "Permissions-Policy": settings.PERMISSIONS_POLICY,
                        "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}.items():
        response.setdefault(name, value)
    headers = [(name.encode("latin-1"), str(value).encode("latin-1")) for name, value in response.items()]
    return [*headers, (b"content-length", str(len(response.content)).encode())]


def served(scope: dict) -> tuple[int, list, bytes]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    def run():          # in a thread of its own, as a server runs it (no event loop left here)
        try:
            async_to_sync(asgi.watch_app)(scope, receive, send)
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
