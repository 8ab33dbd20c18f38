"""The node agents' API (/agent/v1/) does not pass through the browser's
middleware. It authenticates every request by credential and signature, never by a
session or cookie, and answers only JSON, so sessions, locale, CSRF, users, two-factor,
messages, htmx and django-axes have nothing to do there — and were a tenth of a steady
poll's CPU. What still applies to it runs on both paths:

- before this middleware (settings.MIDDLEWARE): SecurityMiddleware (HTTPS redirect, HSTS,
  nosniff, referrer and opener policies), the database-outage 503 and the NUL guard;
- inside it: Permissions-Policy and `Cache-Control: no-store`
  (core.headers.SecurityHeadersMiddleware), X-Frame-Options and the site's CSP — the
  last two as fixed headers composed once (no agent view exempts or amends them; django-csp
  built the policy string anew for every response).

A view's exception becomes a response as anywhere else (handler500: a database outage is
a 503). The agent API also skips the per-request database health check (CONN_HEALTH_CHECKS:
a `SELECT 1` before the first query, a third of a steady report's statements): a poll on a
connection the database dropped is a 503 the agent retries next round, and Django closes
that connection when the request ends (close_if_unusable_or_obsolete), so the next poll
reconnects."""
from asgiref.sync import async_to_sync, iscoroutinefunction
from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.utils import build_policy
from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.db import connections
from django.urls import resolve

from core.headers import SecurityHeadersMiddleware

AGENT_PREFIX = "/agent/v1/"


def _view(request):
    match = resolve(request.path_info)
    request.resolver_match = match
    if iscoroutinefunction(match.func):
        # the watch (fleet/desired_watch.py) on this sync path: under WSGI, where it is not
        # held; the ASGI process serves it without this chain (fleet/asgi.py)
        return async_to_sync(match.func)(request, *match.args, **match.kwargs)
    return match.func(request, *match.args, **match.kwargs)


def fixed_headers() -> dict[str, str]:
    headers = {"X-Frame-Options": settings.X_FRAME_OPTIONS, HEADER: build_policy()}
    if report_only := build_policy(report_only=True):
        headers[HEADER_REPORT_ONLY] = report_only
    return {name: value for name, value in headers.items() if value}


def skip_health_checks() -> None:
    """The agent API's calls skip CONN_HEALTH_CHECKS (above); also called by the ASGI
    process's waits (fleet/asgi.py), which run outside this middleware."""
    for connection in connections.all(initialized_only=True):
        connection.health_check_done = True


class AgentApiMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.headers = fixed_headers()
        self.agent_chain = convert_exception_to_response(SecurityHeadersMiddleware(convert_exception_to_response(_view)))

    def __call__(self, request):
        if not request.path_info.startswith(AGENT_PREFIX):
            return self.get_response(request)
        skip_health_checks()
        response = self.agent_chain(request)
        for name, value in self.headers.items():
            response.setdefault(name, value)
        return response
