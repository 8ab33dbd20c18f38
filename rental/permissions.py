"""Staff permissions that a view declares rather than checks somewhere in its body:
an operator screen outside a ModelAdmin (the ops views under /admin/ops/) is wrapped
in `ops_view(read=..., write=...)`, which both enforces and records what it needs, so a
test can walk every such URL and refuse one that writes under a view permission.

- `read`: the permission (or any one of a tuple of permissions) to GET the page.
- `write`: the permission a POST needs on top of `read`; never a `view_` permission. A
  view without `write` answers a POST with 405: it cannot be used to change anything."""
from dataclasses import dataclass
from functools import wraps

from django.contrib.auth import get_permission_codename
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpResponseNotAllowed

SAFE_METHODS = ("GET", "HEAD")


def is_view_permission(perm: str) -> bool:
    return perm.partition(".")[2].startswith("view_")


@dataclass(frozen=True)
class OpsPermissions:
    read: tuple[str, ...]
    write: str | None

    def may_read(self, user) -> bool:
        return any(user.has_perm(perm) for perm in self.read)


def ops_view(*, read: str | tuple[str, ...], write: str | None = None):
    read = (read,) if isinstance(read, str) else tuple(read)
    if not read:
        raise ImproperlyConfigured("an ops view needs a read permission")
    if write is not None and is_view_permission(write):
        raise ImproperlyConfigured(f"{write} is a view permission: it cannot guard a write")
    declared = OpsPermissions(read=read, write=write)

    def decorate(view):
        @wraps(view)
        def guarded(request, *args, **kwargs):
            if request.method not in SAFE_METHODS and write is None:
                return HttpResponseNotAllowed(SAFE_METHODS)
            if not declared.may_read(request.user):
                raise PermissionDenied
            if request.method not in SAFE_METHODS and not request.user.has_perm(write):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        guarded.ops_permissions = declared
        return guarded

    return decorate


def model_permission(opts, action: str) -> str:
    """'billing.change_paymentreview' for a model's _meta and 'change'."""
    return f"{opts.app_label}.{get_permission_codename(action, opts)}"
