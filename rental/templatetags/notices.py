"""The header's notice indicator: the signed-in customer's unread notices (once per request,
though the nav is rendered twice: inline and in the phone menu)."""
from django import template

from ..lease_page import unread_notices

register = template.Library()


@register.simple_tag(takes_context=True)
def unread_notice_count(context) -> int:
    request = context.get("request")
    if request is None:
        return 0
    if not hasattr(request, "_unread_notices"):
        request._unread_notices = unread_notices(request.user)
    return request._unread_notices
