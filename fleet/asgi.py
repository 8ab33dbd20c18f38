"""The nodes' watch (GET /agent/v1/desired/watch, fleet/desired_watch.py) served straight
from ASGI, around Django's middleware: each of those is sync and would hold a thread for
the whole wait, so 10,000 waiting nodes would be 10,000 threads. Here a waiting node is a
coroutine. What the middleware adds to an agent answer is added here (fleet/middleware.py:
the fixed security headers, Permissions-Policy, no-store); the view itself is the one the
URLconf serves (authentication, rate limit, bad input)."""
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import JsonResponse

from .middleware import fixed_headers

WATCH_PATH = "/agent/v1/desired/watch"
logger = logging.getLogger("fleet.asgi")
_headers: dict[str, str] | None = None


class _NoBody:
    def read(self, *args):
        return b""


async def watch_app(scope, receive, send) -> None:
    """An ASGI application for WATCH_PATH alone (storefront/asgi.py routes to it)."""
    from .views import watch

    global _headers
    if _headers is None:
        _headers = {**fixed_headers(), "Permissions-Policy": settings.PERMISSIONS_POLICY,
                    "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    request = ASGIRequest(scope, _NoBody())
    try:
        await sync_to_async(close_old_connections)()     # a connection the database dropped
        response = await watch(request)
    except Exception:
        logger.exception("watch failed")
        response = JsonResponse({"error": "unavailable"}, status=503)
        response["Retry-After"] = "5"
    for name, value in _headers.items():
        response.setdefault(name, value)
    body = response.content
    headers = [(name.encode("latin-1"), str(value).encode("latin-1")) for name, value in response.items()]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
