"""Operators' screens that span inventory, rental and billing, loaded from
BillingConfig.ready(): the migration actions on nodes and incidents, SLA claims, storage
products, and the operations dashboard and CSV exports (admin views under /admin/ops/)."""
from django.contrib import admin, messages

from inventory.admin import IncidentAdmin, NodeAdmin
from inventory.models import Incident, Node
from rental.failover import MigrationRefused, incident_migrate, node_evacuate


def _report(modeladmin, request, report):
    level = messages.WARNING if report.refused else messages.SUCCESS
    modeladmin.message_user(request, report.summary, level)


class OpsNodeAdmin(NodeAdmin):
    actions = [*NodeAdmin.actions, "migrate_leases"]

    @admin.action(description="Migrate live leases to other nodes at the same site (hardware failure)")
    def migrate_leases(self, request, queryset):
        for node in queryset:
            _report(self, request, node_evacuate(node=node, actor=request.user))


class OpsIncidentAdmin(IncidentAdmin):
    actions = [*IncidentAdmin.actions, "migrate_leases"]

    @admin.action(description="Migrate the affected leases off the failed node(s)")
    def migrate_leases(self, request, queryset):
        for incident in queryset:
            try:
                _report(self, request, incident_migrate(incident=incident, actor=request.user))
            except MigrationRefused as exc:
                self.message_user(request, f"Incident #{incident.pk}: {exc}.", messages.ERROR)


for _model, _admin in ((Node, OpsNodeAdmin), (Incident, OpsIncidentAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)
