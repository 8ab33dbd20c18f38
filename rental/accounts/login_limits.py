"""Sign-in limits that cannot be turned against the owner (docs/adr/0010-limits-that-cannot-lock-out-the-owner.md).

Django-axes locks a username + address pair after AXES_FAILURE_LIMIT failures: that slows
one source and touches nobody else. Guesses spread over many addresses are met here: after
AXES_USERNAME_FAILURE_LIMIT failures for a username (from any address) within
AXES_COOLOFF_TIME the account is *under attack*, and from then on each source (an IPv4
address, an IPv6 /64) may try that username once per LOGIN_PACED_SOURCE_SECONDS — a 429 with
Retry-After, before the password is looked at, that does not count as a failure. There is no
lock: an attacker with many addresses gets one guess per address per interval, and the owner
from any address the attacker does not share gets their first try at once and, after a typo
of their own, another within LOGIN_PACED_SOURCE_SECONDS, however long and from however many
addresses the attack goes on. A browser that signed in to the account before (or recovered it
with a recovery code) carries a signed "known device" cookie naming the account and is not
paced at all. Axes' pair lock still applies to every browser; a session already signed in
(and its two-factor step, reached only with the right password) is never touched."""
import math
import time
import unicodedata

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_login_failed
from django.core import signing
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.shortcuts import render

from .throttle import throttle_address, throttle_counter, throttle_take, throttled

SCOPE = "login-username"
DEVICE_COOKIE = "known_device"
_DEVICE_SALT = "rental.accounts.login_limits.known-device"
_DEVICE_ACCOUNTS = 5  # accounts one browser is remembered for (the latest ones)


def known_accounts(request) -> list[int]:
    """The accounts this browser signed in to (from its signed cookie; [] when absent,
    forged or older than LOGIN_DEVICE_DAYS)."""
    raw = request.COOKIES.get(DEVICE_COOKIE, "")
    if not raw:
        return []
    try:
        value = signing.loads(raw, salt=_DEVICE_SALT, max_age=settings.LOGIN_DEVICE_DAYS * 86400)
    except signing.BadSignature:
        return []
    accounts = value.get("a") if isinstance(value, dict) else None
    return [pk for pk in accounts if isinstance(pk, int)] if isinstance(accounts, list) else []


def remember_device(request, response, user) -> None:
    """Marks this browser as one `user` signed in from (after the password, or a recovery code)."""
    accounts = [pk for pk in known_accounts(request) if pk != user.pk][-(_DEVICE_ACCOUNTS - 1):] + [user.pk]
    response.set_cookie(DEVICE_COOKIE, signing.dumps({"a": accounts}, salt=_DEVICE_SALT),
                        max_age=settings.LOGIN_DEVICE_DAYS * 86400, httponly=True, samesite="Lax",
                        secure=settings.SESSION_COOKIE_SECURE)


def _known_device_of(request, username: str) -> bool:
    accounts = known_accounts(request)
    if not accounts:
        return False
    return User.objects.filter(pk__in=accounts, username__iexact=unicodedata.normalize("NFKC", username)).exists()


class LoginView(auth_views.LoginView):
    """Django's sign-in page, remembering the browser once the password was right."""

    def form_valid(self, form):
        response = super().form_valid(form)
        remember_device(self.request, response, form.get_user())
        return response


def _key(username: str) -> str:
    return "u:" + unicodedata.normalize("NFKC", username).casefold()[:150]


def _window_seconds() -> int:
    return int(settings.AXES_COOLOFF_TIME.total_seconds())


#: The clock pacing reads (tests move it instead of sleeping).
_clock = time.time
PACED_SCOPE = "login-paced"


def failures_key(username: str) -> str:
    """The cache key counting the username's failures in this window."""
    return throttle_counter(SCOPE, None, key=_key(username))


def under_attack(username: str, request) -> bool:
    """Whether the username has had AXES_USERNAME_FAILURE_LIMIT failures in this window."""
    return throttled(SCOPE, request, limit=settings.AXES_USERNAME_FAILURE_LIMIT, key=_key(username))


def paced_take(username: str, request) -> int:
    """One try at `username` from this request's source (address, IPv6 /64): 0 when it may
    go ahead now (and the source's next one is LOGIN_PACED_SOURCE_SECONDS away), else the
    seconds until it may. Taken with one atomic add; a window's end is read from the stored
    time, so a clock moved by a test ends it as the cache's expiry does."""
    interval = settings.LOGIN_PACED_SOURCE_SECONDS
    key = f"throttle:{PACED_SCOPE}:{_key(username)}|{throttle_address(request)}"
    now = _clock()
    if cache.add(key, now + interval, timeout=interval):
        return 0
    until = cache.get(key)
    if not isinstance(until, (int, float)) or until <= now:
        cache.set(key, now + interval, timeout=interval)
        return 0
    return max(1, math.ceil(until - now))


class UsernameLimitBackend:
    """Authenticates nobody; refuses (PermissionDenied stops the chain) a try that comes
    sooner than its source's pace while the username is under attack. Not a BaseBackend:
    without get_user it is never a session's backend (force_login and login() pick the
    first backend that has one)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None or not username or not under_attack(username, request) \
                or _known_device_of(request, username):
            return None
        wait = paced_take(username, request)
        if wait:
            request.login_paced_seconds = wait
            request.axes_locked_out = True  # AxesMiddleware answers with lockout_response
            raise PermissionDenied
        return None


def lockout_response(request, original_response=None, credentials=None):
    """AXES_LOCKOUT_CALLABLE: axes' own pair lock (this address guessed this username too
    often), or the pace of an account under attack; both 429 with Retry-After."""
    paced = getattr(request, "login_paced_seconds", None)
    if paced:
        response = render(request, "registration/login_paced.html",
                          {"seconds": paced, "interval": settings.LOGIN_PACED_SOURCE_SECONDS}, status=429)
        response["Retry-After"] = str(paced)
        return response
    response = render(request, settings.AXES_LOCKOUT_TEMPLATE, {}, status=429)
    response["Retry-After"] = str(_window_seconds())
    return response


@receiver(user_login_failed)
def count_failure(sender, credentials, request=None, **kwargs):
    """A wrong password counts towards the username's attack threshold; a try refused by
    the pace is not a guess (the password was not looked at) and does not count."""
    username = (credentials or {}).get("username")
    if request is not None and isinstance(username, str) and username \
            and not getattr(request, "login_paced_seconds", None):
        throttle_take(SCOPE, request, limit=settings.AXES_USERNAME_FAILURE_LIMIT, window_seconds=_window_seconds(),
                      key=_key(username))
