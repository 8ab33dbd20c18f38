"""Writes a customer makes from their settings: API tokens, saved SSH keys and notification
read marks. A token is shown once at creation; only its SHA-256 and an 8-character prefix
are kept. Tokens carry scopes (read, order, manage, pay) and all die when the password changes."""
import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from inventory.audit import audit_record

from ..models import ApiScope, ApiToken, CustomerSettings, Notification, SshKey

TOKEN_PREFIX = "gpr_"
MAX_TOKENS = 20
ALL_SCOPES = tuple(ApiScope.values)


class TokenLimit(Exception):
    """Too many live tokens; revoke one first."""


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def api_token_create(*, customer: User, name: str, scopes: Iterable[str] = ALL_SCOPES,
                     member: User | None = None) -> tuple[ApiToken, str]:
    """Returns the row and the raw token, which is never stored and cannot be shown again.
    `member`: who makes it for the account `customer` (teams; None or the holder: theirs)."""
    scopes = [s for s in ApiScope.values if s in set(scopes)]  # known ones, in a fixed order
    if not scopes:
        raise ValueError("a token needs at least one scope")
    if ApiToken.objects.filter(customer=customer, revoked_at__isnull=True).count() >= MAX_TOKENS:
        raise TokenLimit
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    member = member if member is not None and member.pk != customer.pk else None
    token = ApiToken.objects.create(customer=customer, member=member, name=name.strip()[:60], token_hash=token_hash(raw),
                                    prefix=raw[len(TOKEN_PREFIX):len(TOKEN_PREFIX) + 8], scopes=" ".join(scopes))
    audit_record(actor=customer, action="api_token_create", obj=token,
                 detail={"prefix": token.prefix, "scopes": scopes})
    return token, raw


@transaction.atomic
def api_tokens_revoke_all(*, customer: User, reason: str, now: datetime | None = None) -> int:
    """Every live token of the customer stops working (e.g. their password changed): their
    own account's and those they made as a member of other accounts (teams)."""
    revoked = ApiToken.objects.filter(Q(customer=customer, member__isnull=True) | Q(member=customer),
                                      revoked_at__isnull=True).update(
        revoked_at=now or timezone.now())
    if revoked:
        audit_record(actor=customer, action="api_tokens_revoke_all", obj=customer,
                     detail={"count": revoked, "reason": reason})
    return revoked


@transaction.atomic
def api_token_revoke(*, customer: User, token_id: int, now: datetime | None = None,
                     member: User | None = None) -> bool:
    """Revokes one of the customer's own tokens; False when it is not theirs or already
    revoked. With `member` (teams): only a token that member made for the account."""
    tokens = ApiToken.objects.filter(pk=token_id, customer=customer, revoked_at__isnull=True)
    if member is not None:
        tokens = tokens.filter(Q(member=member) | Q(member__isnull=True) if member.pk == customer.pk
                               else Q(member=member))
    token = tokens.first()
    if token is None:
        return False
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=now or timezone.now())
    audit_record(actor=customer, action="api_token_revoke", obj=token, detail={"prefix": token.prefix})
    return True


def api_token_authenticate(raw: str, *, now: datetime | None = None) -> ApiToken | None:
    """The live token (with its customer), or None. Marks it used (at most once a minute)."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200 or "\x00" in raw:
        return None
    token = (ApiToken.objects.select_related("customer")
             .filter(token_hash=token_hash(raw), revoked_at__isnull=True, customer__is_active=True).first())
    if token is None:
        return None
    now = now or timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def notification_mark_read(*, customer: User, notification_id: int | None = None,
                           now: datetime | None = None) -> int:
    """Marks one (or, without an id, every) unread notice of the customer read."""
    unread = Notification.objects.filter(customer=customer, read_at__isnull=True)
    if notification_id is not None:
        unread = unread.filter(pk=notification_id)
    return unread.update(read_at=now or timezone.now())


MAX_SSH_KEYS = 20


class SshKeyRefused(Exception):
    """The key cannot be saved as asked; the message says why."""


@transaction.atomic
def ssh_key_add(*, customer: User, name: str, public_key: str) -> SshKey:
    """Save a validated public key under a name (both unique per customer)."""
    from django.core.exceptions import ValidationError

    from ..validators import ssh_key_fingerprint, validate_ssh_public_key

    try:
        line = validate_ssh_public_key(public_key)
    except ValidationError as exc:
        raise SshKeyRefused(exc.messages[0]) from exc
    comment = line.split(" ", 2)[2] if line.count(" ") >= 2 else ""
    name = (" ".join(name.split()) or comment)[:60]  # unnamed: the key's own comment
    if not name:
        raise SshKeyRefused(_("Give the key a name."))
    keys = SshKey.objects.select_for_update().filter(customer=customer)
    fingerprint = ssh_key_fingerprint(line)
    if keys.count() >= MAX_SSH_KEYS:
        raise SshKeyRefused(_("You have %(n)d saved keys; delete one first.") % {"n": MAX_SSH_KEYS})
    if keys.filter(fingerprint=fingerprint).exists():
        raise SshKeyRefused(_("This key is saved already."))
    if keys.filter(name=name).exists():
        raise SshKeyRefused(_("A key named “%(name)s” exists; choose another name.") % {"name": name})
    key = SshKey.objects.create(customer=customer, name=name, public_key=line, fingerprint=fingerprint)
    audit_record(actor=customer, action="ssh_key_add", obj=key, detail={"fingerprint": fingerprint})
    return key


@transaction.atomic
def ssh_key_delete(*, customer: User, key_id: int) -> bool:
    key = SshKey.objects.filter(pk=key_id, customer=customer).first()
    if key is None:
        return False
    audit_record(actor=customer, action="ssh_key_delete", obj=key, detail={"fingerprint": key.fingerprint})
    key.delete()
    return True


# --- the account and its settings row ------------------------------------------------------

@transaction.atomic
def account_create(*, username: str, password: str, email: str = "") -> User:
    user = User.objects.create_user(username=username, password=password, email=email or "")
    CustomerSettings.objects.create(user=user)
    audit_record(actor=user, action="account_create", obj=user)
    return user


def _loaded_settings(user) -> CustomerSettings | None:
    """The customer's settings row when it came with the user (select_related, as the
    lifecycle sweeps read it), else None: the caller queries it."""
    if user is None or not User.rental_settings.is_cached(user):
        return None
    try:
        return user.rental_settings
    except CustomerSettings.DoesNotExist:
        return None


def customer_settings(user: User) -> CustomerSettings:
    return _loaded_settings(user) or CustomerSettings.objects.get_or_create(user=user)[0]


def customer_settings_update(*, user: User, email: str, auto_renew: bool,
                             idle_notices: bool | None = None) -> CustomerSettings:
    """`idle_notices`: None leaves the idle-GPU notice choice as it is."""
    idle = {} if idle_notices is None else {"idle_notices": idle_notices}
    with transaction.atomic():
        prefs = customer_settings(user)
        User.objects.filter(pk=user.pk).update(email=email)
        CustomerSettings.objects.filter(pk=prefs.pk).update(auto_renew=auto_renew, **idle)
        audit_record(actor=user, action="settings_update", obj=prefs,
                     detail={"email_set": bool(email), "auto_renew": auto_renew, **idle})
    prefs.refresh_from_db()
    return prefs
