"""A limit per username on failed sign-ins (issue 28), on top of django-axes' per
username + address lock: 80 guesses at one username from 20 addresses locked nothing.

After AXES_USERNAME_FAILURE_LIMIT failures for a username (from any address) within
AXES_COOLOFF_TIME, every sign-in as it is refused — with the same lockout page axes shows —
until the window ends. The limit is higher than axes' per-pair one, because whoever knows a
username can use it to keep its owner out for one window."""
import unicodedata

from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver

from .throttle import throttle_take, throttled

SCOPE = "login-username"


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
                SCOPE, request, limit=settings.AXES_USERNAME_FAILURE_LIMIT, key=_key(username)):
            request.axes_locked_out = True  # AxesMiddleware answers with its lockout page
            raise PermissionDenied
        return None


@receiver(user_login_failed)
def count_failure(sender, credentials, request=None, **kwargs):
    username = (credentials or {}).get("username")
    if request is not None and isinstance(username, str) and username:
        throttle_take(SCOPE, request, limit=settings.AXES_USERNAME_FAILURE_LIMIT, window_seconds=_window_seconds(),
                      key=_key(username))
