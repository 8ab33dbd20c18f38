"""The Team page (/account/team/): members and their roles, pending invitations, the invite
form; changes are the owners' (the right TEAM). Joining by an invitation link and choosing
which account to act for are the signed-in user's own business (PERSONAL). Plain forms:
every action works without JavaScript."""
from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.cache import never_cache

from ..shown_once import keep_to_show_once, take_to_show
from .models import Membership, Role
from .rights import PERSONAL, SESSION_KEY, TEAM, VIEW, acting_for, customer_view
from .services import (
    MAX_ID,
    TeamRefused,
    accounts_of,
    invitation_accept,
    invitation_create,
    invitation_find,
    invitation_path,
    invitation_revoke,
    member_remove,
    member_role_set,
    pending_invitations,
    team_members,
)

NEW_INVITE = "team-invite"


class InviteForm(forms.Form):
    email = forms.EmailField(label=gettext_lazy("E-mail address"))
    role = forms.ChoiceField(label=gettext_lazy("Role"), choices=Role.choices, initial=Role.DEVELOPER)


def _page(request, *, form=None, status=200):
    acting = acting_for(request)
    kept = take_to_show(request, NEW_INVITE)
    context = {
        "acting": acting, "members": team_members(acting.account), "can_manage": acting.may(TEAM),
        "invitations": pending_invitations(acting.account), "form": form or InviteForm(), "roles": Role.choices,
        "new_invite_link": request.build_absolute_uri(kept["path"]) if kept else "",
        "new_invite_email": kept["email"] if kept else "",
    }
    return render(request, "rental/team.html", context, status=status)


def _back():
    return redirect(reverse("team") + "#members")


@never_cache
@customer_view(VIEW)
def team(request):
    return _page(request)


@never_cache
@customer_view(TEAM)
def team_invite(request):
    if request.method != "POST":
        return _back()
    form = InviteForm(request.POST)
    if not form.is_valid():
        return _page(request, form=form, status=400)
    try:
        invitation, raw = invitation_create(account=request.account, email=form.cleaned_data["email"],
                                            role=form.cleaned_data["role"], invited_by=request.user)
    except TeamRefused as exc:
        form.add_error(None, str(exc))
        return _page(request, form=form, status=400)
    # The link is shown once (only its hash is kept), for an address where mail may not arrive.
    keep_to_show_once(request, NEW_INVITE, {"path": invitation_path(raw), "email": invitation.email})
    messages.success(request, _("Invitation made for %(email)s.") % {"email": invitation.email})
    return _back()


def _member_id(request) -> int:
    try:
        return int(request.POST.get("member", ""))
    except ValueError as exc:
        raise Http404 from exc


@customer_view(TEAM)
def team_role(request):
    if request.method != "POST":
        return _back()
    try:
        changed = member_role_set(account=request.account, member_id=_member_id(request),
                                  role=request.POST.get("role", ""), actor=request.user)
    except TeamRefused as exc:
        messages.error(request, str(exc))
        return _back()
    if changed is None:
        raise Http404
    messages.success(request, _("%(name)s is now %(role)s.") % {"name": changed.member.username,
                                                                 "role": Role(changed.role).label})
    return _back()


@customer_view(TEAM)
def team_remove(request):
    if request.method != "POST":
        return _back()
    try:
        removed = member_remove(account=request.account, member_id=_member_id(request), actor=request.user)
    except TeamRefused as exc:
        messages.error(request, str(exc))
        return _back()
    if not removed:
        raise Http404
    messages.success(request, _("Member removed; their access and API tokens for this account end now."))
    return _back()


@customer_view(TEAM)
def team_invitation_revoke(request, invitation_id: int):
    if request.method != "POST":
        return _back()
    if not invitation_revoke(account=request.account, invitation_id=invitation_id, actor=request.user):
        raise Http404
    messages.success(request, _("Invitation withdrawn."))
    return _back()


@customer_view(PERSONAL)
def team_leave(request):
    """A member leaves the team they act for (the holder cannot leave their own account)."""
    if request.method != "POST":
        return _back()
    acting = acting_for(request)
    if acting.is_own_account:
        messages.error(request, _("This is your own account."))
        return _back()
    member_remove(account=acting.account, member_id=request.user.pk, actor=request.user)
    request.session.pop(SESSION_KEY, None)
    messages.success(request, _("You left %(account)s.") % {"account": acting.account.username})
    return redirect("lease_list")


@never_cache
@customer_view({"GET": "public", "POST": PERSONAL})
def team_join(request, token: str):
    """The invitation link: GET shows what it offers (with log in / sign up links coming back
    here when signed out); POST, signed in, accepts it and acts for the account."""
    invitation = invitation_find(token)
    now = timezone.now()
    if request.method == "POST":
        try:
            membership = invitation_accept(raw=token, user=request.user, now=now)
        except TeamRefused as exc:
            messages.error(request, str(exc))
            return redirect("team_join", token=token)
        request.session[SESSION_KEY] = membership.account_id
        messages.success(request, _("You joined %(account)s as %(role)s; you now act for it.")
                         % {"account": membership.account.username, "role": Role(membership.role).label})
        return redirect("lease_list")
    context = {"invitation": invitation, "usable": invitation is not None and invitation.pending(now),
               "here": request.get_full_path(), "roles": dict(Role.choices)}
    return render(request, "rental/team_join.html", context, status=200 if invitation else 404)


@customer_view(PERSONAL)
def account_switch(request):
    """Act for another account the user is a member of (or their own): kept in the session."""
    if request.method != "POST":
        return redirect("lease_list")
    try:
        chosen = int(request.POST.get("account", ""))
    except ValueError:
        chosen = request.user.pk
    if chosen == request.user.pk:
        request.session.pop(SESSION_KEY, None)
    elif 0 < chosen <= MAX_ID and Membership.objects.filter(account_id=chosen, member=request.user,
                                                            account__is_active=True).exists():
        request.session[SESSION_KEY] = chosen
    else:
        raise Http404
    request._acting = None
    acting = acting_for(request)
    messages.success(request, _("You now act for %(account)s (%(role)s).")
                     % {"account": acting.account.username, "role": Role(acting.role).label})
    return redirect("lease_list")


def switch_choices(user) -> list[tuple[int, str]]:
    return [(user.pk, _("%(name)s (your own account)") % {"name": user.username})] + [
        (m.account_id, f"{m.account.username} ({Role(m.role).label})") for m in accounts_of(user)]
