"""The headers every answer carries, on the browser's middleware chain (settings.MIDDLEWARE)
and on the node agents' own (fleet/middleware.py).

SecurityHeadersMiddleware: Permissions-Policy on every response, and Cache-Control:
no-store on every page served to a signed-in user or to an API token, so no shared or
browser cache keeps account data (new API tokens, recovery codes, invoices).
"""
from django.conf import settings


class SecurityHeadersMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.setdefault("Permissions-Policy", settings.PERMISSIONS_POLICY)
        user = getattr(request, "user", None)
        if (user is not None and user.is_authenticated) or "Authorization" in request.headers:
            response["Cache-Control"] = "no-store"
        return response
