"""The header's notice indicator: the signed-in customer's unread notices (once per request,
though the nav is rendered twice: inline and in the phone menu)."""
import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

from ..lease_page import unread_notices
from ..teams.rights import acting_for

register = template.Library()


@register.simple_tag(takes_context=True)
def unread_notice_count(context) -> int:
    request = context.get("request")
    if request is None:
        return 0
    if not hasattr(request, "_unread_notices"):
        # The acting account's notices (teams: a member sees the team's)
        user = request.user
        account = acting_for(request).account if getattr(user, "is_authenticated", False) else user
        request._unread_notices = unread_notices(account)
    return request._unread_notices


_COMMAND = re.compile(r"(ssh -p \d+ [\w.@-]+)")


@register.filter
def notice_body(body: str) -> str:
    """A notice's text with its connection command set as code (copyable, not prose)."""
    return mark_safe(_COMMAND.sub(r"<code>\1</code>", str(escape(body))))  # noqa: S308 - escaped first
