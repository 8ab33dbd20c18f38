"""The language switcher: Django's own ``set_language`` view (cookie, ``next`` kept), plus
remembering a signed-in customer's choice so that notices and e-mails sent later by the
lifecycle sweeps are written in it (``rental.services.customer_language``).

URLs are the same in every language (no /zh-hans/ prefix): LocaleMiddleware picks the
language from the cookie, else the browser's Accept-Language, else English.
"""
from django.conf import settings
from django.utils.translation import check_for_language
from django.views.decorators.http import require_POST
from django.views.i18n import set_language as django_set_language

from .models import CustomerSettings


def remember_language(user, code: str | None) -> None:
    """Store ``code`` as the customer's language for notices (ignored when unknown)."""
    if not getattr(user, "is_authenticated", False) or not code or not check_for_language(code):
        return
    if code not in dict(settings.LANGUAGES):
        return
    CustomerSettings.objects.update_or_create(user=user, defaults={"language": code})


@require_POST
def set_language(request):
    response = django_set_language(request)
    remember_language(request.user, request.POST.get("language"))
    return response
