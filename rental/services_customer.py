"""Writes a customer makes from their settings: API tokens, saved SSH keys and notification
read marks. A token is shown once at creation; only its SHA-256 and an 8-character prefix
are kept. Tokens carry scopes (read, order, pay) and all die when the password changes."""
import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from inventory.audit import audit_record

from .models import ApiScope, ApiToken, Notification, SshKey

TOKEN_PREFIX = "gpr_"
MAX_TOKENS = 20
ALL_SCOPES = tuple(ApiScope.values)


class TokenLimit(Exception):
    """Too many live tokens; revoke one first."""


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def api_token_create(*, customer: User, name: str, scopes: Iterable[str] = ALL_SCOPES) -> tuple[ApiToken, str]:
    """Returns the row and the raw token, which is never stored and cannot be shown again."""
    scopes = [s for s in ApiScope.values if s in set(scopes)]  # known ones, in a fixed order
    if not scopes:
        raise ValueError("a token needs at least one scope")
    if ApiToken.objects.filter(customer=customer, revoked_at__isnull=True).count() >= MAX_TOKENS:
        raise TokenLimit
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(customer=customer, name=name.strip()[:60], token_hash=token_hash(raw),
                                    prefix=raw[len(TOKEN_PREFIX):len(TOKEN_PREFIX) + 8], scopes=" ".join(scopes))
    audit_record(actor=customer, action="api_token_create", obj=token,
                 detail={"prefix": token.prefix, "scopes": scopes})
    return token, raw


@transaction.atomic
def api_tokens_revoke_all(*, customer: User, reason: str, now: datetime | None = None) -> int:
    """Every live token of the customer stops working (e.g. their password changed)."""
    revoked = ApiToken.objects.filter(customer=customer, revoked_at__isnull=True).update(
        revoked_at=now or timezone.now())
    if revoked:
        audit_record(actor=customer, action="api_tokens_revoke_all", obj=customer,
                     detail={"count": revoked, "reason": reason})
    return revoked


@transaction.atomic
def api_token_revoke(*, customer: User, token_id: int, now: datetime | None = None) -> bool:
    """Revokes one of the customer's own tokens; False when it is not theirs or already revoked."""
    token = ApiToken.objects.filter(pk=token_id, customer=customer, revoked_at__isnull=True).first()
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

    from .validators import ssh_key_fingerprint, validate_ssh_public_key

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


# --- issue 30: per-lease auto-renew -------------------------------------------------------

def lease_auto_renews(lease, *, account_default: bool | None = None) -> bool:
    """Whether this lease's renewal is paid from the balance: its own choice, else the
    account-wide default (the settings page's checkbox; pass it when listing many leases)."""
    if lease.auto_renew is not None:
        return lease.auto_renew
    return account_auto_renew(lease.customer_id) if account_default is None else account_default


def account_auto_renew(customer_id: int) -> bool:
    from .models import CustomerSettings

    default = CustomerSettings.objects.filter(user_id=customer_id).values_list("auto_renew", flat=True).first()
    return True if default is None else default


@transaction.atomic
def lease_auto_renew_set(*, customer: User, lease_id: int, auto_renew: bool | None,
                         now: datetime | None = None) -> bool:
    """Sets (True/False) or clears (None: follow the account) a lease's auto-renew; audited
    as a lease event. False when the lease is not the customer's or has ended."""
    from .models import LIVE_STATES, Lease
    from .services import lease_record

    lease = Lease.objects.select_for_update().filter(pk=lease_id, customer=customer, state__in=LIVE_STATES).first()
    if lease is None:
        return False
    if lease.auto_renew != auto_renew:
        Lease.objects.filter(pk=lease.pk).update(auto_renew=auto_renew)
        lease_record(lease_id=lease.pk, kind="auto_renew_set", now=now or timezone.now(), actor=customer,
                     reason="auto-renew " + {True: "on", False: "off", None: "follows the account"}[auto_renew],
                     data={"auto_renew": auto_renew})
    return True
