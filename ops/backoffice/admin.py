"""Operators' screens that span inventory, rental and billing, loaded by the admin's
autodiscovery (ops/admin.py): the migration actions on nodes and incidents, SLA claims, storage
products, and the operations dashboard and CSV exports (admin views under /admin/ops/)."""
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from billing.admin import dollars
from billing.models import EgressUsage, SlaClaim
from billing.sla.services import ClaimRefused, sla_claim_approve, sla_claim_decline, sla_figures
from core.admin_base import ReadOnlyAdmin, ReadOnlyInlineMixin
from inventory.admin import IncidentAdmin, NodeAdmin
from inventory.models import Incident, Node
from rental.failover import (
    MigrationRefused,
    incident_migrate,
    incident_notify_customers,
    node_evacuate,
)
from rental.models import NetworkVolume, Snapshot, VolumeAttachment
from rental.permissions import ops_view

from . import dashboard as dash

# The dashboard shows revenue and every customer's renewals: a named permission.
OPS_DASHBOARD_PERMISSION = "billing.view_ops_dashboard"


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=300, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             label=_("Reason"), help_text=_("Recorded with your name; the customer sees it."))


class OptionalReasonForm(ReasonForm):
    reason = forms.CharField(max_length=300, required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             label=_("Reason"), help_text=_("Optional; the computed band is recorded anyway."))


def confirm(modeladmin, request, queryset, *, action, title, warning, confirm_label, form_class, headers=(),
            rows=()):
    """First POST shows a confirmation page; the second (with `post`) returns the valid form."""
    form = form_class(request.POST if request.POST.get("post") else None)
    if request.POST.get("post") and form.is_valid():
        return form, None
    context = {**modeladmin.admin_site.each_context(request), "opts": modeladmin.model._meta, "title": title,
               "warning": warning, "objects": list(queryset), "form": form, "action": action,
               "confirm_label": confirm_label, "checkbox_name": helpers.ACTION_CHECKBOX_NAME,
               "headers": headers, "rows": rows}
    request.current_app = modeladmin.admin_site.name
    return None, TemplateResponse(request, "admin/ops/confirm.html", context)


def _report(modeladmin, request, report):
    level = messages.WARNING if report.refused else messages.SUCCESS
    modeladmin.message_user(request, report.summary, level)


class OpsNodeAdmin(NodeAdmin):
    actions = [*NodeAdmin.actions, "migrate_leases"]

    @admin.action(description=_("Migrate live leases to other nodes at the same site (hardware failure)"), permissions=["change"])
    def migrate_leases(self, request, queryset):
        for node in queryset:
            _report(self, request, node_evacuate(node=node, actor=request.user))


class OpsIncidentAdmin(IncidentAdmin):
    actions = [*IncidentAdmin.actions, "migrate_leases"]

    def save_model(self, request, obj, form, change):
        """Opening an incident takes hardware out of service: its customers are told."""
        super().save_model(request, obj, form, change)
        if not change:
            sent = incident_notify_customers(incident=Incident.objects.get(pk=obj.pk))
            self.message_user(request, gettext("%(n)s customer(s) notified.") % {"n": sent}, messages.INFO)

    @admin.action(description=_("Migrate the affected leases off the failed node(s)"), permissions=["change"])
    def migrate_leases(self, request, queryset):
        for incident in queryset:
            try:
                _report(self, request, incident_migrate(incident=incident, actor=request.user))
            except MigrationRefused as exc:
                self.message_user(request, gettext("Incident #%(id)s: %(error)s.") % {"id": incident.pk, "error": exc},
                                  messages.ERROR)


for _model, _admin in ((Node, OpsNodeAdmin), (Incident, OpsIncidentAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)


# --- SLA claims -----------------------------------------------------------------------------

@admin.register(SlaClaim)
class SlaClaimAdmin(admin.ModelAdmin):
    list_display = ("id", "lease", "customer", "period", "availability_pct", "credit", "state", "created_at",
                    "decided_by")
    list_filter = ("state", "period")
    search_fields = ("lease__id", "customer__username", "message")
    list_select_related = ("lease__offer__gpu_model", "customer", "decided_by")
    readonly_fields = ("lease", "customer", "period", "message", "state", "created_at", "paid_seconds",
                       "downtime_seconds", "availability_pct", "credit_cents", "figures_now", "decided_by",
                       "decided_at", "decision_reason", "ledger_entry")
    actions = ["approve", "decline"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description=_("credit"), ordering="credit_cents")
    def credit(self, obj):
        return dollars(obj.credit_cents)

    @admin.display(description=_("computed from today's records"))
    def figures_now(self, obj):
        f = sla_figures(lease=obj.lease, period=obj.period, now=timezone.now())
        return gettext("availability %(pct)s%% (%(down)s min down of %(paid)s h paid); %(band)s; "
                       "credit %(credit)s") % {"pct": f.availability_pct, "down": f.downtime_seconds // 60,
                                               "paid": f.paid_seconds // 3600, "band": f.band,
                                               "credit": dollars(f.credit_cents)}

    def _rows(self, queryset):
        now = timezone.now()
        rows = []
        for claim in queryset.select_related("lease"):
            f = sla_figures(lease=claim.lease, period=claim.period, now=now)
            rows.append((f"#{claim.pk}", gettext("lease #%(id)s") % {"id": claim.lease_id}, f"{claim.period:%Y-%m}",
                         f"{f.availability_pct}%", f.band, dollars(f.credit_cents)))
        return (gettext("claim"), gettext("lease"), gettext("month"), gettext("availability"), gettext("band"),
                gettext("credit")), rows

    @admin.action(description=_("Approve: credit the computed amount to the customer's balance"), permissions=["change"])
    def approve(self, request, queryset):
        headers, rows = self._rows(queryset)
        form, page = confirm(self, request, queryset, action="approve", title=gettext("Approve SLA claims"),
                             warning=gettext("These credits go to the customers' balances (once per lease and "
                                             "month)."),
                             confirm_label=gettext("Approve and credit"), form_class=OptionalReasonForm,
                             headers=headers, rows=rows)
        if page:
            return page
        for claim in queryset:
            try:
                claim = sla_claim_approve(claim=claim, actor=request.user, now=timezone.now(),
                                          reason=form.cleaned_data["reason"])
            except ClaimRefused as exc:
                self.message_user(request, str(exc), messages.WARNING)
                continue
            if claim.state == SlaClaim.State.APPROVED:
                self.message_user(request, gettext("Claim #%(id)s: %(credit)s credited.")
                                  % {"id": claim.pk, "credit": dollars(claim.credit_cents)}, messages.SUCCESS)
            else:
                self.message_user(request, gettext("Claim #%(id)s declined: %(reason)s")
                                  % {"id": claim.pk, "reason": claim.decision_reason}, messages.WARNING)

    @admin.action(description=_("Decline with a reason"), permissions=["change"])
    def decline(self, request, queryset):
        headers, rows = self._rows(queryset)
        form, page = confirm(self, request, queryset, action="decline", title=gettext("Decline SLA claims"),
                             warning=gettext("The customer sees your reason."), confirm_label=gettext("Decline"),
                             form_class=ReasonForm, headers=headers, rows=rows)
        if page:
            return page
        for claim in queryset:
            try:
                sla_claim_decline(claim=claim, actor=request.user, reason=form.cleaned_data["reason"],
                                  now=timezone.now())
                self.message_user(request, gettext("Claim #%(id)s declined.") % {"id": claim.pk}, messages.SUCCESS)
            except ClaimRefused as exc:
                self.message_user(request, str(exc), messages.WARNING)


# --- admin views under /admin/ops/ ------------------------------------------------------------

@ops_view(read=OPS_DASHBOARD_PERMISSION)
def dashboard_view(request):
    board = dash.dashboard(timezone.now())
    context = {**admin.site.each_context(request), "title": gettext("Operations dashboard"), "board": board,
               "totals": board.capacity_totals}
    return TemplateResponse(request, "admin/ops/dashboard.html", context)


@ops_view(read="rental.view_lease")
def holds_view(request):
    """Who holds what: unpaid orders and the GPUs they keep from sale until pay_by."""
    context = {**admin.site.each_context(request), "title": gettext("Unpaid orders holding GPUs"),
               "holds": dash.unpaid_holds(), "limit": settings.MAX_OPEN_UNPAID_ORDERS}
    return TemplateResponse(request, "admin/ops/holds.html", context)


def ops_urls():
    from .exports import export_view  # noqa: PLC0415 (exports imports this module's neighbours)
    from .views import customer_detail, customer_list

    return [
        path("ops/customers/", admin.site.admin_view(customer_list), name="ops_customers"),
        path("ops/customers/<int:user_id>/", admin.site.admin_view(customer_detail), name="ops_customer"),
        path("ops/dashboard/", admin.site.admin_view(dashboard_view), name="ops_dashboard"),
        path("ops/exports/", admin.site.admin_view(export_view), name="ops_exports"),
        path("ops/holds/", admin.site.admin_view(holds_view), name="ops_holds"),
    ]


def _install_ops_urls(site):
    """Mount the ops views inside the admin site (staff only, admin namespace) without
    touching the root URLconf: admin.site.urls is evaluated after app loading."""
    if getattr(site, "_ops_urls_installed", False):
        return
    original = site.get_urls
    site.get_urls = lambda: ops_urls() + original()
    site._ops_urls_installed = True


_install_ops_urls(admin.site)


# --- storage products and egress (read-only: writes go through storage.charges / rental.storage) ---

class VolumeAttachmentInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = VolumeAttachment
    fields = ("lease", "attached_at", "detached_at")


@admin.register(NetworkVolume)
class NetworkVolumeAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "customer", "site", "size_tb", "state", "paid_until", "created_at")
    list_filter = ("state", "site")
    search_fields = ("name", "customer__username")
    list_select_related = ("customer", "site")
    inlines = [VolumeAttachmentInline]


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ("id", "customer", "source_lease", "region", "size_tb", "state", "paid_until", "created_at")
    list_filter = ("state", "region")
    search_fields = ("customer__username", "source_lease__id")
    list_select_related = ("customer", "source_lease__offer__gpu_model")


@admin.register(EgressUsage)
class EgressUsageAdmin(ReadOnlyAdmin):
    list_display = ("lease", "term_start", "tb_used", "billed_overage_tb", "reported_at")
    search_fields = ("lease__id",)
    list_select_related = ("lease__offer__gpu_model",)
