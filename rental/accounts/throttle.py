"""A small fixed-window counter in the cache (Redis in production), per client address as
django-axes resolves it (one rule for "the client's address"). Logins are django-axes'
job; this guards sign-ups and the forgot-password form. With the cache down it fails open:
the limits are a brake on abuse, never a reason to refuse a real customer."""
import hashlib
import ipaddress

from axes.helpers import IPWARE_INSTALLED, get_client_ip_address
from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches
from django.core.signals import setting_changed
from django.dispatch import receiver
from python_ipware.modern.parsers import TIER_GLOBAL, TIER_REJECT, ip_tier

from .throttle_reservations import Reservations, reservation_units

#: The header order under which a lone IPv4 entry is the client (settings.AXES_IPWARE_*).
_PLAIN_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR")
#: Whether the settings let _plain_ipv4 answer: worked out once, again after a test changes one.
_PLAIN_SETTINGS: list[bool] = []


@receiver(setting_changed)
def _forget_plain_settings(**kwargs) -> None:
    _PLAIN_SETTINGS.clear()


def _plain_settings() -> bool:
    if not _PLAIN_SETTINGS:
        _PLAIN_SETTINGS.append(
            IPWARE_INSTALLED and settings.AXES_CLIENT_IP_CALLABLE is None and settings.AXES_IPWARE_PROXY_COUNT == 0
            and tuple(settings.AXES_IPWARE_META_PRECEDENCE_ORDER) == _PLAIN_ORDER
            and not settings.AXES_IPWARE_PROXY_TRUSTED_IPS
            and getattr(settings, "IPWARE_ALGORITHM", None) in (None, "modern"))
    return _PLAIN_SETTINGS[0]


def client_address(request) -> str:
    return _plain_ipv4(request.META) or get_client_ip_address(request) or "unknown"


def _plain_ipv4(meta) -> str | None:
    """The address django-axes would resolve, when the request makes it plain under the
    project's proxy settings: X-Forwarded-For as Caddy sets it (one global IPv4 address), or
    no such header and an IPv4 REMOTE_ADDR; else None, and axes resolves it. Axes' resolver
    (python-ipware) gives the same there, but first folds every META key (most of an API
    request's rate-limit cost); tests/rental/test_client_address.py holds the two together.
    python-ipware's own ranking (ip_tier) decides "global", not a copy of it."""
    if not _plain_settings():
        return None
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    # Django spells META's header keys one way (WSGI and ASGI), so an absent key is an
    # absent header, which python-ipware's case-folded look-up would not find either
    value, least = (meta.get("REMOTE_ADDR"), TIER_REJECT + 1) if forwarded is None else (forwarded, TIER_GLOBAL)
    if type(value) is not str or not value[:1].isdigit():
        return None
    try:
        ip = ipaddress.IPv4Address(value)  # dotted decimal only, no leading zeros: as written
    except ValueError:
        return None
    # a non-global forwarded entry is ranked against REMOTE_ADDR by python-ipware: its way
    return value if ip_tier(ip) >= least else None


#: One IPv6 client is a /64: a host is handed a whole /64 and picks any address in it, so
#: counting per address would give each guess a fresh counter.
IPV6_CLIENT_PREFIX = 64


def throttle_address(request) -> str:
    """What a per-address throttle counts on: the IPv4 address, or the IPv6 address's /64."""
    plain = _plain_ipv4(request.META)
    if plain is not None:  # an IPv4 client counts as itself, as written
        return plain
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


def throttle_take_reserving(scope: str, request, *, limit: int, window_seconds: int, reservations_per_window: int,
                            key: str | None = None) -> bool:
    """throttle_take for a high limit on a hot path (the API's): a process takes
    ``limit // reservations_per_window`` uses of the window at once and spends them without a
    round trip each (rental.accounts.throttle_reservations: never more than ``limit`` in a
    window; at most the units other processes hold unspent early). A small limit, or a cache
    without reservations (the local-memory one of development and tests), counts use by use."""
    counter = _scoped(scope, request, key)
    units = reservation_units(limit, reservations_per_window)
    backend = caches[DEFAULT_CACHE_ALIAS]
    if units == 1 or not hasattr(backend, "reserve"):
        return _hit(counter, window_seconds) <= limit
    return _RESERVATIONS.take(backend, counter, limit=limit, units=units, window_seconds=window_seconds)


_RESERVATIONS = Reservations()


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
    # the backend looked up once (``cache`` finds it again on every attribute)
    backend = caches[DEFAULT_CACHE_ALIAS]
    if hasattr(backend, "hit"):             # Redis (core.cache): one round trip
        return backend.hit(key, window_seconds)[0]
    try:  # within a window its counter exists: one increment, not a refused add first
        return backend.incr(key)
    except ValueError:  # the window's first use, or it ended
        pass
    if backend.add(key, 1, timeout=window_seconds):
        return 1
    try:
        return backend.incr(key)
    except ValueError:  # expired between add and incr
        backend.set(key, 1, timeout=window_seconds)
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
    try:
        return str(ipaddress.ip_address(client_address(request)))
    except ValueError:
        return None
