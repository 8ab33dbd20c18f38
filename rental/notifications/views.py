"""The settings page's webhook section: the endpoint URL, its secret (shown once
when made or rotated), the delivery log and "redeliver". Plain forms, no JavaScript."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from ..account_page import settings_context
from ..accounts.throttle import per_user, throttle_posts
from ..teams.rights import customer_view
from .models import WebhookDelivery, WebhookEndpoint
from .sending import Refused, check_url, resolve
from .services import (
    delivery_redeliver,
    event_emit,
    webhook_endpoint_delete,
    webhook_endpoint_save,
    webhook_secret_rotate,
)

SECTION = "#webhooks"


def _back():
    return redirect(reverse("account_settings") + SECTION)


def _with_secret(request, secret: str):
    return render(request, "rental/settings.html", settings_context(request, new_webhook_secret=secret))


@customer_view("webhooks")
@never_cache
@login_required
@require_POST
def webhook_save(request):
    url = request.POST.get("url", "")
    try:
        _scheme, host, port = check_url(url.strip())
        resolve(host, port)  # a URL that resolves to a private address is refused now, not at each event
        endpoint, secret = webhook_endpoint_save(customer=request.account, url=url)
    except Refused as exc:
        messages.error(request, _("Webhook URL refused: %(why)s.") % {"why": exc})
        return _back()
    if secret:
        return _with_secret(request, secret)
    messages.success(request, _("Webhook URL saved."))
    return _back()


@customer_view("webhooks")
@never_cache
@login_required
@require_POST
def webhook_rotate(request):
    endpoint = WebhookEndpoint.objects.filter(owner=request.account, scope=WebhookEndpoint.Scope.CUSTOMER).first()
    if endpoint is None:
        raise Http404
    return _with_secret(request, webhook_secret_rotate(endpoint=endpoint, actor=request.account))


@customer_view("webhooks")
@login_required
@require_POST
def webhook_delete(request):
    if not webhook_endpoint_delete(customer=request.account):
        raise Http404
    messages.success(request, _("Webhook removed: no more events are sent."))
    return _back()


#: Customer-triggered outbound calls share one per-customer allowance.
manual_send_throttled = throttle_posts("webhook-manual-send", limit="WEBHOOK_MANUAL_SENDS_PER_USER",
                                       window_minutes="WEBHOOK_MANUAL_SEND_WINDOW_MINUTES", key=per_user)


@customer_view("webhooks")
@login_required
@require_POST
@manual_send_throttled
def webhook_test(request):
    now = timezone.now()
    if not event_emit(event="webhook.test", term=f"test@{now.isoformat()}", customer=request.account, now=now,
                      data={"message": "test event from the settings page"}):
        raise Http404
    messages.success(request, _("Test event queued; see the delivery log."))
    return _back()


@customer_view("webhooks")
@login_required
@require_POST
@manual_send_throttled
def webhook_redeliver(request, delivery_id: int):
    delivery = WebhookDelivery.objects.filter(pk=delivery_id, endpoint__owner=request.account,
                                              endpoint__scope=WebhookEndpoint.Scope.CUSTOMER).first()
    if delivery is None:
        raise Http404
    delivery_redeliver(delivery=delivery, actor=request.account)
    messages.success(request, _("Queued again with a new delivery id."))
    return _back()
