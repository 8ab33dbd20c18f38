"""The team in the JSON API (docs/API.md, "Teams"): list, invite, change a role, remove,
withdraw an invitation. Reading is every member's (right VIEW, scope read); changes are the
owners' (right TEAM) with a token that has the manage scope."""
from django.http import Http404, JsonResponse
from django.utils.translation import gettext as _

from .api import ApiError, api_endpoint, json_body
from .api_schema import iso
from .teams.rights import TEAM, role_rights
from .teams.services import (
    TeamRefused,
    invitation_create,
    invitation_path,
    invitation_revoke,
    member_remove,
    member_role_set,
    pending_invitations,
    team_members,
)


def _refused(exc: TeamRefused) -> ApiError:
    return ApiError(409, "refused", str(exc))


def invitation_json(invitation) -> dict:
    return {"id": invitation.pk, "email": invitation.email, "role": invitation.role,
            "invited_by": invitation.invited_by.username if invitation.invited_by else None,
            "created_at": iso(invitation.created_at), "expires_at": iso(invitation.expires_at)}


def _team_json(request) -> dict:
    account = request.api_user
    data = {"account": account.username,
            "you": {"username": request.api_member.username, "role": request.api_role,
                    "rights": sorted(role_rights(request.api_role))},
            "members": [{"id": row["user"].pk, "username": row["user"].username, "role": row["role"],
                         "holder": row["holder"], "since": iso(row["since"])} for row in team_members(account)]}
    if TEAM in role_rights(request.api_role):   # addresses of people not (yet) in it: the owners'
        data["invitations"] = [invitation_json(i) for i in pending_invitations(account)]
    return data


@api_endpoint("GET", "POST", scope={"GET": "read", "POST": "manage"}, right={"GET": "view", "POST": "team"})
def team(request):
    """GET: the members, your role and (owners) the pending invitations. POST {"email",
    "role"}: invites; the reply's `link` (a path) is shown this once."""
    if request.method == "GET":
        return JsonResponse(_team_json(request))
    data = json_body(request)
    email, role = data.get("email"), data.get("role")
    if not isinstance(email, str) or not isinstance(role, str):
        raise ApiError(400, "invalid", _("Give “email” and “role” (owner, billing, developer or read_only)."),
                       fields={"email": [_("An e-mail address.")]} if not isinstance(email, str) else
                       {"role": [_("owner, billing, developer or read_only")]})
    try:
        invitation, raw = invitation_create(account=request.api_user, email=email, role=role,
                                            invited_by=request.api_member)
    except TeamRefused as exc:
        raise ApiError(400, "invalid", str(exc)) from exc
    return JsonResponse({**invitation_json(invitation), "link": invitation_path(raw)}, status=201)


@api_endpoint("PATCH", "DELETE", scope="manage", right="team")
def member(request, member_id: int):
    """PATCH {"role"}: changes a member's role; DELETE: removes them (their tokens for this
    account stop at once). 409 for the account holder, who stays an owner."""
    if request.method == "DELETE":
        try:
            removed = member_remove(account=request.api_user, member_id=member_id, actor=request.api_member)
        except TeamRefused as exc:
            raise _refused(exc) from exc
        if not removed:
            raise Http404
        return JsonResponse({"removed": member_id})
    role = json_body(request).get("role")
    if not isinstance(role, str):
        raise ApiError(400, "invalid", _("Give “role”."), fields={"role": [_("owner, billing, developer or read_only")]})
    try:
        changed = member_role_set(account=request.api_user, member_id=member_id, role=role, actor=request.api_member)
    except TeamRefused as exc:
        raise (_refused(exc) if role in ("owner", "billing", "developer", "read_only")
               else ApiError(400, "invalid", str(exc), fields={"role": [str(exc)]})) from exc
    if changed is None:
        raise Http404
    return JsonResponse({"id": member_id, "username": changed.member.username, "role": changed.role})


@api_endpoint("DELETE", scope="manage", right="team")
def invitation(request, invitation_id: int):
    if not invitation_revoke(account=request.api_user, invitation_id=invitation_id, actor=request.api_member):
        raise Http404
    return JsonResponse({"revoked": invitation_id})
