"""Guards around every request (settings.MIDDLEWARE, the root URLconf's handler500).

DatabaseUnavailableMiddleware: when PostgreSQL is down or restarting, a view's
OperationalError/InterfaceError becomes a clean 503 with Retry-After (JSON under /api/,
a small static page elsewhere; neither touches the database again) instead of a 500.
`server_error` (the root URLconf's handler500) does the same for errors raised in other
middleware (e.g. the session save), so no database outage ever shows as a 500. With
CONN_HEALTH_CHECKS the next request after the database is back reconnects by itself.

TwoFactorMiddleware: staff must enrol an authenticator (rental.accounts.views) before anything
else, and anyone who enrolled must give a code after the password before anything else.

NulByteGuardMiddleware: a NUL in the query string or a form field is a 400 before any view
(PostgreSQL text cannot hold one).

The headers every response carries (Permissions-Policy, no-store when signed in) are
core.headers.SecurityHeadersMiddleware: the agent API's own chain adds them too (fleet/middleware.py).
"""
import logging
import sys

from django.conf import settings
from django.core.handlers.wsgi import WSGIRequest
from django.db import InterfaceError, OperationalError
from django.http import (
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    JsonResponse,
    QueryDict,
)
from django.urls import reverse
from django.utils.http import urlencode
from django.views import defaults

logger = logging.getLogger("storefront.outage")

RETRY_AFTER_SECONDS = 30
DB_ERRORS = (OperationalError, InterfaceError)

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Back in a moment · GPU Rental</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><h1>Back in a moment</h1>
<p>We cannot reach our database right now. Nothing you did was lost: please try again in
half a minute.</p></main></body></html>
"""


def database_unavailable(request, exc: BaseException | None = None) -> HttpResponse:
    logger.warning("database unavailable: %s %s: %s: %s", request.method, request.path,
                   type(exc).__name__ if exc else "?", str(exc).splitlines()[0][:200] if exc else "")
    if request.path.startswith("/api/"):
        response = JsonResponse({"error": "unavailable",
                                 "message": "The database is unavailable; retry shortly."}, status=503)
    else:
        response = HttpResponse(PAGE, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, DB_ERRORS):
            return database_unavailable(request, exception)
        return None


def server_error(request, *args, **kwargs):
    """handler500: a database outage is a 503, anything else the usual 500 page."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DB_ERRORS):
        return database_unavailable(request, exc)
    return defaults.server_error(request, *args, **kwargs)


class TwoFactorMiddleware:
    """Install after django_otp.middleware.OTPMiddleware. A signed-in user who has an
    authenticator and has not given a code this session, or a staff user who has not
    enrolled one, reaches only the two-factor pages and logout: every other request (any
    method, password change included) is sent to the code step or to enrolment."""

    EXEMPT_NAMES = ("otp_setup", "otp_verify", "logout", "admin:logout", "set_language")

    def __init__(self, get_response):
        self.get_response = get_response
        self._exempt: set[str] | None = None

    def __call__(self, request):
        target = self._redirect_target(request)
        if target:
            return HttpResponseRedirect(reverse(target) + "?" + urlencode({"next": request.get_full_path()}))
        return self.get_response(request)

    def _exempt_path(self, path: str) -> bool:
        if self._exempt is None:
            self._exempt = {reverse(name) for name in self.EXEMPT_NAMES}
        # The API authenticates by bearer token and never reads the session.
        return path in self._exempt or path.startswith(("/static/", "/api/", "/healthz"))

    def _redirect_target(self, request) -> str | None:
        user = request.user
        if not user.is_authenticated or user.is_verified() or self._exempt_path(request.path):
            return None
        from rental.accounts.two_factor import is_enrolled

        if is_enrolled(user):
            return "otp_verify"
        return "otp_setup" if user.is_staff else None


class NulByteGuardMiddleware:
    """A NUL in the query string or a form field is a 400 here, before any view: PostgreSQL
    text cannot hold one (a DataError, i.e. a 500, from filters such as the admin's
    ?state=%00), and no legitimate input contains one."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if type(request) is WSGIRequest and "GET" not in request.__dict__:  # the first to read it
            query = plain_query(request.environ.get("QUERY_STRING", ""), request.encoding)
            if query is not None:
                request.GET = query
        if self._has_nul(request):
            if request.path.startswith("/api/"):
                return JsonResponse({"error": "bad_request", "message": "NUL characters are not allowed."},
                                    status=400)
            return HttpResponseBadRequest("NUL characters are not allowed.", content_type="text/plain")
        return self.get_response(request)

    @staticmethod
    def _has_nul(request) -> bool:
        if "\x00" in request.path:
            return True
        sources = [request.GET]
        if request.method == "POST" and request.content_type == "application/x-www-form-urlencoded":
            sources.append(request.POST)
        return any("\x00" in key or any("\x00" in v for v in values)
                   for source in sources for key, values in source.lists())


def plain_query(query_string: str, encoding: str | None) -> QueryDict | None:
    """``QueryDict(query_string, encoding=encoding)`` (what ``request.GET`` is) for a plain
    query string: ASCII, no "%" escape and no "+", within DATA_UPLOAD_MAX_NUMBER_FIELDS; else
    None (Django parses it). Django's parse appends each field through a dozen Python calls
    (a fifth of a bare view's cost for a calculator query); a plain one decodes to itself, so
    its fields are its "&"-separated parts split at their first "=", blanks kept, empty
    parts skipped, as parse_qsl splits them (tests/security/test_plain_query.py holds the
    two alike)."""
    if not query_string or "%" in query_string or "+" in query_string or not query_string.isascii():
        return None
    limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    if limit is not None and query_string.count("&") + 1 > limit:
        return None  # Django's own parse refuses it (TooManyFieldsSent)
    fields: dict[str, list[str]] = {}
    for part in query_string.split("&"):
        if part:
            name, _, value = part.partition("=")
            fields.setdefault(name, []).append(value)
    query = QueryDict(encoding=encoding)
    dict.update(query, fields)  # a QueryDict is a dict of lists; built here, immutable after
    return query


class FriendlyNotFoundMiddleware:
    """The demo store (`make run`, DEBUG=1) answers an unknown page with the site's own
    404 page in the reader's language, not Django's debug page listing every URL pattern.
    Installed only with DEBUG (settings); DEBUG_TECHNICAL_404=1 brings the debug
    page back for development. JSON answers (the API's 404) are left alone."""

    DEBUG_PAGE = b"<title>Page not found at "  # django/views/templates/technical_404.html

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code == 404 and self.DEBUG_PAGE in getattr(response, "content", b"")[:2000]:
            from django.template.response import TemplateResponse

            page = TemplateResponse(request, "404.html", status=404)
            page.render()
            return page
        return response
