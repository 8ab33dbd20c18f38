"""`{% customer_webhook user as hook %}`: the account's webhook endpoint and its
latest deliveries, for the settings page."""
from django import template

from rental.notifications.models import WebhookEndpoint
from rental.notifications.services import EVENTS

register = template.Library()

LOG_ROWS = 25


@register.simple_tag
def customer_webhook(user):
    endpoint = WebhookEndpoint.objects.filter(owner=user, scope=WebhookEndpoint.Scope.CUSTOMER).first()
    deliveries = list(endpoint.deliveries.all()[:LOG_ROWS]) if endpoint else []
    return {"endpoint": endpoint, "deliveries": deliveries, "events": EVENTS}
