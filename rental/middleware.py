"""Two guards around every request.

DatabaseUnavailableMiddleware: when PostgreSQL is down or restarting, a view's
OperationalError/InterfaceError becomes a clean 503 with Retry-After (JSON under /api/,
a small static page elsewhere; neither touches the database again) instead of a 500.
`server_error` (the root URLconf's handler500) does the same for errors raised in other
middleware (e.g. the session save), so no database outage ever shows as a 500. With
CONN_HEALTH_CHECKS the next request after the database is back reconnects by itself.

AdminOTPRequiredMiddleware: a staff user who has enrolled a TOTP device (rental.otp_views)
must enter a code before the admin opens; until then admin requests redirect to the
verify page. Staff without a device keep password-only access until they enrol.
"""
import logging
import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.views import defaults

logger = logging.getLogger("rental.outage")

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


class AdminOTPRequiredMiddleware:
    """Install after django_otp.middleware.OTPMiddleware."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if self._needs_code(request):
            verify = reverse("otp_verify") + "?" + urlencode({"next": request.get_full_path()})
            return HttpResponseRedirect(verify)
        return self.get_response(request)

    @staticmethod
    def _needs_code(request) -> bool:
        admin = reverse("admin:index")
        if not request.path.startswith(admin) or request.path.startswith(reverse("admin:logout")):
            return False
        user = request.user
        if not (user.is_authenticated and user.is_staff) or user.is_verified():
            return False
        from django_otp import user_has_device

        return user_has_device(user, confirmed=True)
