"""Operators' screens for the ledger and the webhooks: endpoints (an operator endpoint gets
every customer's events), the delivery log with a "redeliver" action, the dispatches."""
from django.contrib import admin, messages
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from core.admin_base import ReadOnlyAdmin

from .models import Dispatch, WebhookDelivery, WebhookEndpoint
from .services import delivery_redeliver


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ("url", "scope", "owner", "is_active", "created_at")
    list_filter = ("scope", "is_active")
    search_fields = ("url", "owner__username")
    readonly_fields = ("secret",)
    fields = ("owner", "scope", "url", "is_active", "secret", "created_at")

    def get_changeform_initial_data(self, request):
        return {"owner": request.user.pk, "scope": WebhookEndpoint.Scope.OPERATOR, "created_at": timezone.now()}


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "event", "endpoint", "state", "attempts", "last_status", "last_error",
                    "delivered_at", "delivery_id")
    list_filter = ("state", "event")
    search_fields = ("delivery_id", "endpoint__url", "dispatch__term")
    list_select_related = ("endpoint",)
    actions = ["redeliver"]

    def has_change_permission(self, request, obj=None):  # the action needs it; fields stay read-only
        return request.user.has_perm("rental.change_webhookdelivery")

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_redeliver_permission(self, request):
        """A redelivery posts the event again: the delivery's change permission."""
        return request.user.has_perm("rental.change_webhookdelivery")

    @admin.action(description=_("Redeliver (a new delivery of the same event)"), permissions=["redeliver"])
    def redeliver(self, request, queryset):
        for delivery in queryset:
            delivery_redeliver(delivery=delivery, actor=request.user)
        self.message_user(request, ngettext("%(n)d delivery queued again.", "%(n)d deliveries queued again.",
                                            queryset.count()) % {"n": queryset.count()}, messages.SUCCESS)


@admin.register(Dispatch)
class DispatchAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "recipient", "event", "term", "sent_at")
    list_filter = ("event",)
    search_fields = ("recipient", "term")
