"""A small fixed-window counter in the cache (Redis in production), per client address as
django-axes resolves it (one rule for "the client's address"). Logins are django-axes'
job; this guards sign-ups and the forgot-password form. With the cache down it fails open:
the limits are a brake on abuse, never a reason to refuse a real customer."""
from axes.helpers import get_client_ip_address
from django.core.cache import cache


def client_address(request) -> str:
    return get_client_ip_address(request) or "unknown"


def _key(scope: str, request) -> str:
    return f"throttle:{scope}:{client_address(request)}"


def throttled(scope: str, request, *, limit: int) -> bool:
    """True when this address already used up `limit` in the current window."""
    return (cache.get(_key(scope, request)) or 0) >= limit


def throttle_hit(scope: str, request, *, window_seconds: int) -> int:
    """Counts one use; the window starts with the first."""
    key = _key(scope, request)
    if cache.add(key, 1, timeout=window_seconds):
        return 1
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=window_seconds)
        return 1
