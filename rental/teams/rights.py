"""Who acts for which account, and what each customer page and API route needs.

Every request of a signed-in customer acts for one account (a user: leases, invoices and
the balance are keyed to it) as one member (the user signed in) in one role. A user is
always the owner of their own account; a Membership lets them act for another one, chosen
in the session (`account_switch`). `acting_for(request)` resolves this once per request.

A customer page declares the right it needs with `customer_view(right)` (or one right
per method: `customer_view({"GET": VIEW, "POST": ORDER})`); an API route with
`api_endpoint(..., right=...)` beside its scope. tests/rental/test_team_rights.py walks every
customer URL and API route and fails on one that declares nothing. Inside a declared view,
`request.account` is the account to read and write (filter by it, never by request.user) and
`request.user` the member; the audit rows name the member (core.audit.acting_member)."""
from dataclasses import dataclass
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpResponseNotAllowed

from core.audit import acting_member

from .models import Membership, Role

# --- the rights -------------------------------------------------------------------------------
VIEW = "view"          #: see the account's leases, invoices, storage, notices
ORDER = "order"        #: orders, payments, invoices, refunds, balance, renewals, SLA claims
OPERATE = "operate"    #: instances (start/stop/restart/restore), SSH keys, snapshots, volumes, S3 keys
TOKENS = "tokens"      #: the member's own API tokens
WEBHOOKS = "webhooks"  #: the account's webhook endpoint
TEAM = "team"          #: invite, change roles, remove members; every member's tokens
PUBLIC = "public"      #: a page in the customer area anyone may read (no account involved)
PERSONAL = "personal"  #: the signed-in user's own business, whatever account they act for
                       #: (accepting an invitation, switching accounts): login, no role

RIGHTS = (VIEW, ORDER, OPERATE, TOKENS, WEBHOOKS, TEAM)

ROLE_RIGHTS: dict[str, frozenset[str]] = {
    Role.OWNER: frozenset(RIGHTS),
    Role.BILLING: frozenset({VIEW, ORDER}),
    Role.DEVELOPER: frozenset({VIEW, OPERATE, TOKENS}),
    Role.READ_ONLY: frozenset({VIEW}),
}

#: What an API token's scope also needs of its member's role, when a view asks for a
#: scope beyond its route's (`require_scope(request, "pay")`): paying is a billing right.
SCOPE_RIGHTS = {"read": VIEW, "order": ORDER, "manage": OPERATE, "pay": ORDER}

SESSION_KEY = "acting_account"
SAFE_METHODS = ("GET", "HEAD")


def role_rights(role: str | None) -> frozenset[str]:
    return ROLE_RIGHTS.get(role, frozenset())


def role_of(*, account, member) -> str | None:
    """The member's role in the account, None when they are not in it."""
    if account is None or member is None or not member.is_active:
        return None   # a deactivated member's tokens stop with their sign-in
    if account.pk == member.pk:
        return Role.OWNER
    return (Membership.objects.filter(account=account, member=member, account__is_active=True)
            .values_list("role", flat=True).first())


@dataclass(frozen=True)
class Acting:
    account: object
    member: object
    role: str

    @property
    def rights(self) -> frozenset[str]:
        return role_rights(self.role)

    def may(self, right: str) -> bool:
        return right == PUBLIC or right in self.rights

    @property
    def is_own_account(self) -> bool:
        return self.account.pk == self.member.pk


def acting_for(request) -> Acting:
    """The signed-in user's acting account and role (resolved once per request)."""
    cached = getattr(request, "_acting", None)
    if cached is not None and cached.member.pk == request.user.pk:
        return cached
    user = request.user
    acting = Acting(account=user, member=user, role=Role.OWNER)
    chosen = request.session.get(SESSION_KEY) if hasattr(request, "session") else None
    if chosen and chosen != user.pk:
        membership = (Membership.objects.select_related("account")
                      .filter(account_id=chosen, member=user, account__is_active=True).first())
        if membership is not None:
            acting = Acting(account=membership.account, member=user, role=membership.role)
        else:  # removed since: back to their own account
            request.session.pop(SESSION_KEY, None)
    request._acting = acting
    return acting


def declared_rights(rights) -> dict[str, str]:
    """{method: right} from one right for every method or a mapping; "*" = any method."""
    if isinstance(rights, str):
        per_method = {"*": rights}
    else:
        per_method = {method.upper(): right for method, right in dict(rights).items()}
        if "GET" in per_method:
            per_method.setdefault("HEAD", per_method["GET"])
    unknown = set(per_method.values()) - set(RIGHTS) - {PUBLIC, PERSONAL}
    if unknown or not per_method:
        raise ImproperlyConfigured(f"unknown right(s) {sorted(unknown)}: use one of {RIGHTS} or PUBLIC")
    return per_method


def needed_right(per_method: dict[str, str], method: str) -> str | None:
    return per_method.get(method, per_method.get("*"))


def customer_view(rights):
    """Declares (and enforces) the right a customer page needs: 302 to the login page when
    signed out, 403 when the acting role lacks the right, 405 for a method not declared.
    Sets request.account (whose objects the view reads and writes) and request.acting."""
    per_method = declared_rights(rights)

    def decorate(view):
        @wraps(view)
        def guarded(request, *args, **kwargs):
            needed = needed_right(per_method, request.method)
            if needed is None:
                return HttpResponseNotAllowed(sorted(m for m in per_method if m != "*"))
            if needed == PUBLIC:
                return view(request, *args, **kwargs)
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if needed == PERSONAL:
                return view(request, *args, **kwargs)
            acting = acting_for(request)
            request.account, request.acting = acting.account, acting
            if not acting.may(needed):
                raise PermissionDenied(f"the {acting.role} role lacks the “{needed}” right")
            with acting_member(account_id=acting.account.pk, member=acting.member):
                return view(request, *args, **kwargs)

        guarded.customer_rights = per_method
        return guarded

    return decorate


def may(request, right: str) -> bool:
    """In a declared view: whether the acting role also has `right` (e.g. to show a form)."""
    return acting_for(request).may(right)
