"""A limit per username on failed sign-ins, on top of django-axes' per username + address
lock: 80 guesses at one username from 20 addresses locked nothing.

After AXES_USERNAME_FAILURE_LIMIT failures for a username (from any address) within
AXES_COOLOFF_TIME, sign-ins as it from an *unknown* browser are refused — with the same
lockout page axes shows — until the window ends. A lock that anyone can renew must not keep
the owner out: a browser that signed in to the account before (or recovered it with a
recovery code) carries a signed "known device" cookie naming the account, and is never
refused by this lock, whoever guesses. Axes' per username + address lock still applies to
it, so guessing stays slowed per source; a session already signed in (and its two-factor
step) is never touched by either."""
import unicodedata

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_login_failed
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver

from .throttle import throttle_take, throttled

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


class UsernameLimitBackend:
    """Authenticates nobody; refuses (PermissionDenied stops the chain) a locked username.
    Not a BaseBackend: without get_user it is never a session's backend (force_login and
    login() pick the first backend that has one)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is not None and username and throttled(
                SCOPE, request, limit=settings.AXES_USERNAME_FAILURE_LIMIT, key=_key(username)) \
                and not _known_device_of(request, username):
            request.axes_locked_out = True  # AxesMiddleware answers with its lockout page
            raise PermissionDenied
        return None


@receiver(user_login_failed)
def count_failure(sender, credentials, request=None, **kwargs):
    username = (credentials or {}).get("username")
    if request is not None and isinstance(username, str) and username:
        throttle_take(SCOPE, request, limit=settings.AXES_USERNAME_FAILURE_LIMIT, window_seconds=_window_seconds(),
                      key=_key(username))
