"""The nodes' waits (GET /agent/v1/desired/watch and POST /agent/v1/report/watch,
fleet/desired_watch.py) served straight from ASGI, around Django's middleware: each of those
is sync and would hold a thread for the whole wait, so 10,000 waiting nodes would be 10,000
threads. Here a waiting node is a coroutine. What the middleware adds to an agent answer is added here (fleet/middleware.py:
the fixed security headers, Permissions-Policy, no-store); the view itself is the one the
URLconf serves (authentication, rate limit, bad input)."""
import io
import logging

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import JsonResponse

from .middleware import fixed_headers

WATCH_PATH = "/agent/v1/desired/watch"
REPORT_WATCH_PATH = "/agent/v1/report/watch"
logger = logging.getLogger("fleet.asgi")
# The headers the middleware would add, encoded once: (name, value) in bytes, by name.
_added: dict[str, tuple[bytes, bytes]] | None = None


class _NoBody:
    def read(self, *args):
        return b""


def _added_headers() -> dict[str, tuple[bytes, bytes]]:
    global _added
    if _added is None:
        headers = {**fixed_headers(), "Permissions-Policy": settings.PERMISSIONS_POLICY,
                   "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
        _added = {name: (name.encode("latin-1"), str(value).encode("latin-1")) for name, value in headers.items()}
    return _added


def response_headers(response) -> list[tuple[bytes, bytes]]:
    """The answer's own headers, then each added one it does not set itself (as setdefault
    would, in the same order), then its length."""
    added = _added_headers()
    own = response.headers
    headers = [(name.encode("latin-1"), str(value).encode("latin-1")) for name, value in own.items()]
    headers += [pair for name, pair in added.items() if name not in own]
    headers.append((b"content-length", str(len(response.content)).encode()))
    return headers


async def _body(receive) -> bytes | None:
    """The request's body, None past DATA_UPLOAD_MAX_MEMORY_SIZE (reading stops there)."""
    limit, chunks, size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE, [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":        # the client left before sending it all
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def watch_app(scope, receive, send) -> None:
    """An ASGI application for WATCH_PATH and REPORT_WATCH_PATH alone (storefront/asgi.py
    routes them here)."""
    from .views import report_watch, watch

    view = report_watch if scope["path"] == REPORT_WATCH_PATH else watch
    try:
        body = await _body(receive) if scope["method"] == "POST" else b""
        if body is None:
            response = JsonResponse({"error": "too_large"}, status=413)
        else:
            # a connection the database dropped is closed in the view's own trip to a thread
            response = await view(ASGIRequest(scope, io.BytesIO(body) if body else _NoBody()),
                                  fresh_connections=True)
    except Exception:
        logger.exception("%s failed", scope["path"])
        response = JsonResponse({"error": "unavailable"}, status=503)
        response["Retry-After"] = "5"
    await send({"type": "http.response.start", "status": response.status_code, "headers": response_headers(response)})
    await send({"type": "http.response.body", "body": response.content})
