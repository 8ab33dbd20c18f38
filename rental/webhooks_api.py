"""The account's webhook in the JSON API: the settings page's webhook section (rental.
notifications.views) with the same services, URL checks and send allowance. A new or
rotated secret is in that answer only (rental.idempotency does not keep it)."""
from django.conf import settings
from django.http import Http404, JsonResponse
from django.utils import timezone
from django.utils.translation import gettext as _

from .accounts.throttle import throttle_take
from .api import ApiError, api_endpoint, iso, json_body
from .notifications.models import WebhookDelivery, WebhookEndpoint
from .notifications.sending import Refused, check_url, resolve
from .notifications.services import (
    delivery_redeliver,
    event_emit,
    webhook_endpoint_delete,
    webhook_endpoint_save,
    webhook_secret_rotate,
)


def _endpoint(customer) -> WebhookEndpoint | None:
    return WebhookEndpoint.objects.filter(owner=customer, scope=WebhookEndpoint.Scope.CUSTOMER).first()


def _endpoint_json(endpoint: WebhookEndpoint, secret: str | None = None) -> JsonResponse:
    deliveries = endpoint.deliveries.order_by("-created_at", "-pk")[:20]
    response = JsonResponse({
        "url": endpoint.url, "active": endpoint.is_active, "created_at": iso(endpoint.created_at),
        **({"secret": secret} if secret else {}),
        "deliveries": [{"id": d.pk, "delivery_id": str(d.delivery_id), "event": d.event, "state": d.state,
                        "attempts": d.attempts, "last_status": d.last_status, "created_at": iso(d.created_at),
                        "delivered_at": iso(d.delivered_at)} for d in deliveries]})
    response.shown_once = bool(secret)
    return response


def _within_manual_sends(request) -> None:
    """The page's allowance (WEBHOOK_MANUAL_SENDS_PER_USER per window), the same counter."""
    if not throttle_take("webhook-manual-send", request, limit=settings.WEBHOOK_MANUAL_SENDS_PER_USER,
                         window_seconds=60 * settings.WEBHOOK_MANUAL_SEND_WINDOW_MINUTES,
                         key=f"user:{request.api_user.pk}"):
        raise ApiError(429, "rate_limited", _("Too many requests; try again in a minute."),
                       limit="WEBHOOK_MANUAL_SENDS_PER_USER")


@api_endpoint("GET", "POST", "DELETE", scope={"GET": "read", "POST": "manage", "DELETE": "manage"}, right={"GET": "view", "POST": "webhooks", "DELETE": "webhooks"})
def webhook(request):
    """GET: the endpoint and its latest deliveries. POST {"url"}: set it (a new endpoint's
    secret is in this answer only). DELETE: remove it."""
    if request.method == "GET":
        endpoint = _endpoint(request.api_user)
        if endpoint is None:
            raise Http404
        return _endpoint_json(endpoint)
    if request.method == "DELETE":
        if not webhook_endpoint_delete(customer=request.api_user):
            raise Http404
        return JsonResponse({"deleted": True})
    url = json_body(request).get("url")
    url = url if isinstance(url, str) else ""
    try:
        _scheme, host, port = check_url(url.strip())
        resolve(host, port)
        endpoint, secret = webhook_endpoint_save(customer=request.api_user, url=url)
    except Refused as exc:
        raise ApiError(400, "invalid", _("Webhook URL refused: %(why)s.") % {"why": exc},
                       fields={"url": [str(exc)]}) from exc
    return _endpoint_json(endpoint, secret)


@api_endpoint("POST", scope="manage", right="webhooks")
def webhook_rotate(request):
    endpoint = _endpoint(request.api_user)
    if endpoint is None:
        raise Http404
    return _endpoint_json(endpoint, webhook_secret_rotate(endpoint=endpoint, actor=request.api_user))


@api_endpoint("POST", scope="manage", right="webhooks")
def webhook_test(request):
    _within_manual_sends(request)
    now = timezone.now()
    if not event_emit(event="webhook.test", term=f"test@{now.isoformat()}", customer=request.api_user, now=now,
                      data={"message": "test event from the API"}):
        raise Http404
    return JsonResponse({"message": _("Test event queued; see the delivery log.")}, status=202)


@api_endpoint("POST", scope="manage", right="webhooks")
def webhook_redeliver(request, delivery_id: int):
    delivery = WebhookDelivery.objects.filter(pk=delivery_id, endpoint__owner=request.api_user,
                                              endpoint__scope=WebhookEndpoint.Scope.CUSTOMER).first()
    if delivery is None:
        raise Http404
    _within_manual_sends(request)
    again = delivery_redeliver(delivery=delivery, actor=request.api_user)
    return JsonResponse({"id": again.pk, "delivery_id": str(again.delivery_id),
                         "message": _("Queued again with a new delivery id.")}, status=202)
