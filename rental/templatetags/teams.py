"""The header's team indicator: which account the signed-in user acts for, in which role,
and the others they may switch to (resolved once per request; the nav is drawn twice)."""
from django import template

from ..teams.models import Role
from ..teams.rights import acting_for
from ..teams.services import accounts_of

register = template.Library()


@register.simple_tag(takes_context=True)
def acting_account(context) -> dict | None:
    request = context.get("request")
    if request is None or not getattr(request.user, "is_authenticated", False):
        return None
    if not hasattr(request, "_acting_nav"):
        acting = acting_for(request)
        others = accounts_of(request.user)
        request._acting_nav = {
            "acting": acting, "role_label": Role(acting.role).label, "own": acting.is_own_account,
            "choices": [(request.user.pk, request.user.username)] + [
                (m.account_id, f"{m.account.username} ({Role(m.role).label})") for m in others] if others else [],
        }
    return request._acting_nav
