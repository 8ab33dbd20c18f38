"""A limit on every write a signed-in customer makes on the site's pages: each POST (PUT,
PATCH, DELETE) counts against CUSTOMER_WRITES_PER_MINUTE per account, and past it the answer
is a 429 page with Retry-After and the view does not run. Many of those writes call out of
the store — a snapshot, a volume or an S3 key is made on the site's Ceph, a payment address
from a coin wallet, a webhook URL is resolved in DNS — so a script in a signed-in browser
could otherwise make the store hammer them. One limit at the edge covers every such page,
those added later too (tests/security/test_customer_write_limits.py walks the URLconf).

Not counted here: the API (its own limits per address and per token), the node agents'
API (per credential), staff (the admin), and anonymous forms (sign-in, sign-up, recovery and
resets have limits of their own)."""
from django.conf import settings
from django.shortcuts import render

from .throttle import throttle_take

SCOPE = "customer-writes"
WINDOW_SECONDS = 60
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
EXEMPT_PREFIXES = ("/api/", "/agent/", "/admin/")


class CustomerWriteLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if request.method in WRITES and user is not None and user.is_authenticated and not user.is_staff \
                and not request.path_info.startswith(EXEMPT_PREFIXES) \
                and not throttle_take(SCOPE, request, limit=settings.CUSTOMER_WRITES_PER_MINUTE,
                                      window_seconds=WINDOW_SECONDS, key=f"user:{user.pk}"):
            response = render(request, "registration/throttled.html", status=429)
            response["Retry-After"] = str(WINDOW_SECONDS)  # at most one window
            return response
        return self.get_response(request)
