"""Changes to a team: invitations (made, accepted, revoked), roles, removals. Each change
leaves an AuditEntry naming who made it. The account's holder is an owner always (their
user is the account: leases, invoices and the balance are keyed to it), so the account can
never be left without an owner; further owners are members with the owner role."""
import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from inventory.audit import audit_record

from ..models import ApiToken
from .models import Invitation, Membership, Role

TOKEN_PREFIX = "inv_"


class TeamRefused(Exception):
    """A change the rules refuse; the message says why, for the customer."""


def invitation_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _role(role: str) -> str:
    if role not in Role.values:
        raise TeamRefused(_("Choose a role: owner, billing, developer or read-only."))
    return role


def team_size(account: User) -> int:
    """Members plus pending invitations."""
    now = timezone.now()
    return (Membership.objects.filter(account=account).count()
            + Invitation.objects.filter(account=account, accepted_at__isnull=True, revoked_at__isnull=True,
                                        expires_at__gt=now).count())


@transaction.atomic
def invitation_create(*, account: User, email: str, role: str, invited_by: User,
                      now: datetime | None = None) -> tuple[Invitation, str]:
    """A single-use invitation for `email` to join `account` in `role`; returns the row and
    the raw link token (only its hash is stored). Mailed to the address after commit."""
    now = now or timezone.now()
    role = _role(role)
    email = (email or "").strip()
    if not email or "@" not in email or len(email) > 254:
        raise TeamRefused(_("Give the e-mail address to invite."))
    User.objects.select_for_update().filter(pk=account.pk).first()  # one change to a team at a time
    if team_size(account) >= settings.WORKBENCH_TEAM_MAX_MEMBERS:
        raise TeamRefused(_("This team is full (%(n)s members and invitations); remove one first.")
                          % {"n": settings.WORKBENCH_TEAM_MAX_MEMBERS})
    if email.lower() == (account.email or "").lower() or Membership.objects.filter(
            account=account, member__email__iexact=email).exists():
        raise TeamRefused(_("%(email)s is already in this team.") % {"email": email})
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        account=account, email=email, role=role, token_hash=invitation_hash(raw), invited_by=invited_by,
        created_at=now, expires_at=now + timedelta(days=settings.WORKBENCH_TEAM_INVITE_DAYS))
    audit_record(actor=invited_by, action="team_invite", obj=invitation, at=now,
                 detail={"account": account.pk, "email": email, "role": role})
    transaction.on_commit(lambda: _mail_invitation(invitation, raw))
    return invitation, raw


def invitation_path(raw: str) -> str:
    return reverse("team_join", args=[raw])


def _public_url(path: str) -> str:
    """PUBLIC_URL, else https:// and the first named host, like the notices' links (not
    imported from rental.notifications, whose pages import the rights from here)."""
    base = settings.PUBLIC_URL or next((f"https://{host}" for host in settings.ALLOWED_HOSTS
                                        if host not in ("*", "") and not host.startswith(".")), "")
    return base.rstrip("/") + path


def _mail_invitation(invitation: Invitation, raw: str) -> None:
    """Best effort, like the notices' mail: the owner also sees the link once on the page."""
    send_mail(
        _("You are invited to a GPU rental team"),
        _("%(who)s invites you to act for the account %(account)s as %(role)s.\n\n"
          "Open this link while logged in (or sign up first) to accept; it works once, until %(until)s UTC:\n"
          "%(link)s\n") % {"who": invitation.invited_by.username if invitation.invited_by else "",
                           "account": invitation.account.username, "role": Role(invitation.role).label,
                           "until": invitation.expires_at.strftime("%Y-%m-%d %H:%M"),
                           "link": _public_url(invitation_path(raw))},
        settings.DEFAULT_FROM_EMAIL, [invitation.email], fail_silently=True)


def invitation_find(raw: str) -> Invitation | None:
    if not isinstance(raw, str) or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    return Invitation.objects.select_related("account", "invited_by").filter(token_hash=invitation_hash(raw)).first()


@transaction.atomic
def invitation_accept(*, raw: str, user: User, now: datetime | None = None) -> Membership:
    """`user` joins the invitation's account in its role; the link is spent."""
    now = now or timezone.now()
    found = invitation_find(raw)
    invitation = (Invitation.objects.select_for_update().select_related("account").filter(pk=found.pk).first()
                  if found else None)
    if invitation is None or invitation.revoked_at is not None:
        raise TeamRefused(_("This invitation does not exist or was withdrawn."))
    if invitation.accepted_at is not None:
        raise TeamRefused(_("This invitation has been used already."))
    if invitation.expires_at <= now:
        raise TeamRefused(_("This invitation has expired; ask for a new one."))
    if invitation.account_id == user.pk:
        raise TeamRefused(_("This is your own account."))
    if not invitation.account.is_active:
        raise TeamRefused(_("This account is closed."))
    try:
        with transaction.atomic():
            membership = Membership.objects.create(account=invitation.account, member=user, role=invitation.role,
                                                   invited_by=invitation.invited_by, created_at=now)
    except IntegrityError as exc:
        raise TeamRefused(_("You are in this team already.")) from exc
    Invitation.objects.filter(pk=invitation.pk).update(accepted_at=now, accepted_by=user)
    audit_record(actor=user, action="team_join", obj=membership, at=now,
                 detail={"account": invitation.account_id, "invitation": invitation.pk, "role": invitation.role})
    return membership


@transaction.atomic
def invitation_revoke(*, account: User, invitation_id: int, actor: User, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    if not 0 < invitation_id <= MAX_ID:
        return False
    invitation = Invitation.objects.filter(pk=invitation_id, account=account, accepted_at__isnull=True,
                                           revoked_at__isnull=True).first()
    if invitation is None:
        return False
    Invitation.objects.filter(pk=invitation.pk).update(revoked_at=now)
    audit_record(actor=actor, action="team_invite_revoke", obj=invitation, at=now,
                 detail={"account": account.pk, "email": invitation.email})
    return True


#: Ids past a 64-bit column are nobody's (a query with one would fail in the driver).
MAX_ID = 2**63 - 1


def _membership(account: User, member_id: int) -> Membership | None:
    if not 0 < member_id <= MAX_ID:
        return None
    return (Membership.objects.select_for_update().select_related("member")
            .filter(account=account, member_id=member_id).first())


def _refuse_holder(account: User, member_id: int) -> None:
    if member_id == account.pk:
        # The holder's user is the account (its leases, invoices and balance): it stays an
        # owner, so the team always has one.
        raise TeamRefused(_("The account holder is always an owner: they cannot be demoted or removed."))


def owners_count(account: User) -> int:
    return 1 + Membership.objects.filter(account=account, role=Role.OWNER).count()


@transaction.atomic
def member_role_set(*, account: User, member_id: int, role: str, actor: User,
                    now: datetime | None = None) -> Membership | None:
    """None when `member_id` is not in the team."""
    now = now or timezone.now()
    role = _role(role)
    _refuse_holder(account, member_id)
    User.objects.select_for_update().filter(pk=account.pk).first()
    membership = _membership(account, member_id)
    if membership is None:
        return None
    before = membership.role
    if before == Role.OWNER and role != Role.OWNER and owners_count(account) <= 1:
        raise TeamRefused(_("The last owner cannot be demoted."))
    if before != role:
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.role = role
        audit_record(actor=actor, action="team_role", obj=membership, at=now,
                     detail={"account": account.pk, "member": member_id, "from": before, "to": role})
    return membership


@transaction.atomic
def member_remove(*, account: User, member_id: int, actor: User, now: datetime | None = None) -> bool:
    """The member stops acting for the account at once (their next request, their tokens
    for it: rental.teams.rights resolves the role on every request). False: not in it."""
    now = now or timezone.now()
    _refuse_holder(account, member_id)
    User.objects.select_for_update().filter(pk=account.pk).first()
    membership = _membership(account, member_id)
    if membership is None:
        return False
    if membership.role == Role.OWNER and owners_count(account) <= 1:
        raise TeamRefused(_("The last owner cannot be removed."))
    # Their tokens for this account are powerless from now on (the role is read per request);
    # revoking them too means a later invitation does not bring old tokens back to life.
    revoked = ApiToken.objects.filter(customer=account, member_id=member_id, revoked_at__isnull=True).update(
        revoked_at=now)
    audit_record(actor=actor, action="team_remove", obj=membership, at=now,
                 detail={"account": account.pk, "member": member_id, "role": membership.role,
                         "left": actor.pk == member_id, "tokens_revoked": revoked})
    membership.delete()
    return True


def team_members(account: User) -> list[dict]:
    """The holder first, then the members: {user, role, holder, since, invited_by}."""
    rows = [{"user": account, "role": Role.OWNER, "holder": True, "since": account.date_joined, "invited_by": None}]
    for m in Membership.objects.filter(account=account).select_related("member", "invited_by"):
        rows.append({"user": m.member, "role": m.role, "holder": False, "since": m.created_at,
                     "invited_by": m.invited_by})
    return rows


def pending_invitations(account: User, now: datetime | None = None):
    return Invitation.objects.filter(account=account, accepted_at__isnull=True, revoked_at__isnull=True,
                                     expires_at__gt=now or timezone.now()).select_related("invited_by")


def accounts_of(user: User) -> list[Membership]:
    """The other accounts `user` may act for."""
    return list(Membership.objects.filter(member=user, account__is_active=True).select_related("account")
                .order_by("account__username"))
