"""A small fixed-window counter in the cache (Redis in production), per client address as
django-axes resolves it (one rule for "the client's address"). Logins are django-axes'
job; this guards sign-ups and the forgot-password form. With the cache down it fails open:
the limits are a brake on abuse, never a reason to refuse a real customer."""
import hashlib

from axes.helpers import get_client_ip_address
from django.core.cache import cache


def client_address(request) -> str:
    return get_client_ip_address(request) or "unknown"


#: One IPv6 client is a /64: a host is handed a whole /64 and picks any address in it, so
#: counting per address would give each guess a fresh counter.
IPV6_CLIENT_PREFIX = 64


def throttle_address(request) -> str:
    """What a per-address throttle counts on: the IPv4 address, or the IPv6 address's /64."""
    import ipaddress

    address = client_address(request)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # an IPv4 client seen through a dual-stack socket
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/{IPV6_CLIENT_PREFIX}", strict=False))
    return str(ip)


def _key(scope: str, request) -> str:
    return f"throttle:{scope}:{throttle_address(request)}"


def throttled(scope: str, request, *, limit: int, key: str | None = None) -> bool:
    """True when this address (or `key`) already used up `limit` in the current window."""
    return (cache.get(_scoped(scope, request, key)) or 0) >= limit


def throttle_hit(scope: str, request, *, window_seconds: int) -> int:
    """Counts one use; the window starts with the first."""
    return _hit(_key(scope, request), window_seconds)


# --- Reserve-then-act, and throttles declared on a view -----------------------------

def throttle_take(scope: str, request, *, limit: int, window_seconds: int, key: str | None = None) -> bool:
    """Counts one use first and answers whether it is within `limit`: concurrent requests
    cannot all pass a check made before any of them counted (the counter is one atomic
    increment in Redis). Give it back with throttle_give_back when the use did not happen."""
    return _hit(_scoped(scope, request, key), window_seconds) <= limit


def throttle_take_reading(scope: str, request, *, limit: int, window_seconds: int, key: str | None = None,
                          read: tuple = ()) -> tuple[bool, dict]:
    """throttle_take, and the cache keys `read` (as cache.get_many finds them) in the same
    round trip where the cache allows it (an agent's poll)."""
    counter = _scoped(scope, request, key)
    if hasattr(cache, "hit"):
        count, found = cache.hit(counter, window_seconds, read=read)
        return count <= limit, found
    return _hit(counter, window_seconds) <= limit, cache.get_many(read) if read else {}


def throttle_counter(scope: str, request, *, key: str | None = None) -> str:
    """The cache key of the counter throttle_take counts on (for a script that counts it
    in a round trip of its own, fleet/seq.py)."""
    return _scoped(scope, request, key)


def throttle_give_back(scope: str, request, *, key: str | None = None) -> None:
    try:
        cache.decr(_scoped(scope, request, key))
    except ValueError:  # the window ended meanwhile
        pass


def _scoped(scope: str, request, key: str | None) -> str:
    """A given key (a username, an e-mail address) is hashed: any text makes a safe cache key."""
    if key is None:
        return _key(scope, request)
    return f"throttle:{scope}:{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}"


def _hit(key: str, window_seconds: int) -> int:
    if hasattr(cache, "hit"):             # Redis (core.cache): one round trip
        return cache.hit(key, window_seconds)[0]
    if cache.add(key, 1, timeout=window_seconds):
        return 1
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=window_seconds)
        return 1


def per_user(request) -> str:
    return f"user:{request.user.pk}"


def per_posted_email(request) -> str:
    return "email:" + request.POST.get("email", "").strip().lower()[:254]


def throttle_posts(scope: str, *, limit: str, window_minutes: str, key=None):
    """Decorates a view: each POST counts against the named settings `limit` per
    `window_minutes` (per client address, or per `key(request)`); past it the POST is a
    429 page and the view does not run. Settings are read at request time."""
    from functools import wraps

    from django.conf import settings
    from django.shortcuts import render

    def decorate(view):
        @wraps(view)
        def guarded(request, *args, **kwargs):
            if request.method == "POST" and not throttle_take(
                    scope, request, limit=getattr(settings, limit),
                    window_seconds=getattr(settings, window_minutes) * 60, key=key(request) if key else None):
                response = render(request, "registration/throttled.html", status=429)
                response["Retry-After"] = str(getattr(settings, window_minutes) * 60)  # at most one window
                return response
            return view(request, *args, **kwargs)

        return guarded

    return decorate


def order_address(request) -> str | None:
    """The client's address as stored on an order (a valid IP address), or None."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(get_client_ip_address(request) or ""))
    except ValueError:
        return None
