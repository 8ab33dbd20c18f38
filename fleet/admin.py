"""Nodes get agent columns (last report age, version, GPUs reported, "not reporting") and
two actions: a one-time enrolment code (shown once) and revoking the credential. The
agents, their evidence and instance reports are read-only here: nodes write them."""
from django.conf import settings
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.admin_base import ReadOnlyAdmin, ReadOnlyInlineMixin
from inventory.models import Node
from ops.backoffice.admin import OpsNodeAdmin
from rental.admin import LeaseAdmin
from rental.models import Lease

from .conditions import rule_for
from .health import NodeHealth
from .models import Evidence, InstanceReport, NodeAgent
from .services import enrolment_code_create, node_credential_revoke


class FleetNodeAdmin(OpsNodeAdmin):
    list_display = (*OpsNodeAdmin.list_display, "agent_version", "last_report", "gpus_reported")
    actions = [*OpsNodeAdmin.actions, "enrolment_code", "revoke_credential"]
    readonly_fields = (*OpsNodeAdmin.readonly_fields, "reported_gpus")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("agent")

    def _health(self, obj) -> NodeHealth:
        return NodeHealth(node=obj, agent=getattr(obj, "agent", None), now=timezone.now())

    @admin.display(description=_("agent"))
    def agent_version(self, obj):
        health = self._health(obj)
        if health.agent is None or health.agent.credential_hash is None:
            return gettext("not enrolled")
        return health.agent.agent_version or "—"

    @admin.display(description=_("last report"))
    def last_report(self, obj):
        health = self._health(obj)
        if health.agent is None or health.agent.credential_hash is None:
            return "—"
        age = health.report_age
        text = gettext("never") if age is None else gettext("%(min)s min ago") % {"min": int(age.total_seconds() // 60)}
        if health.stale:
            return format_html('<strong class="errornote" style="padding:2px 6px">{} — {}</strong>',
                               gettext("not reporting"), text)
        return text

    @admin.display(description=_("GPUs reported"))
    def gpus_reported(self, obj):
        health = self._health(obj)
        if health.agent is None or health.agent.last_report_at is None:
            return "—"
        if health.agent.gpu_library == "none":
            return gettext("no GPU library")
        return f"{health.gpus_reported} / {obj.gpu_count}"

    @admin.display(description=_("GPUs as the node reports them"))
    def reported_gpus(self, obj):
        """Per GPU: link, NVLink peers, MIG and each named condition with its rule
        (fleet/conditions.py) — what the operator acts on and what buyers are shown."""
        agent = getattr(obj, "agent", None)
        if agent is None or not agent.gpus:
            return "—"
        rows = []
        for gpu in agent.gpus:
            topo = gpu.get("topology") or {}
            link = (f"PCIe gen {topo.get('pcie_gen')}/{topo.get('pcie_max_gen')} "
                    f"x{topo.get('pcie_width')}/{topo.get('pcie_max_width')}") if topo.get("pcie_width") else "—"
            nvlink = (f"{topo.get('nvlink_active', 0)} links, peers {topo.get('nvlink_peers')}"
                      if topo.get("nvlink_active") else gettext("no NVLink"))
            found = ", ".join(f"{c['code']} ({rule_for(c['code'])}): {c['detail']}"
                              for c in gpu.get("conditions") or []) or gettext("healthy")
            rows.append(format_html("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                                    gpu.get("index"), gpu.get("name"), link, nvlink,
                                    "MIG" if topo.get("mig") else "—", found))
        head = format_html("<tr><th>#</th><th>{}</th><th>PCIe</th><th>NVLink</th><th>MIG</th><th>{}</th></tr>",
                           gettext("model"), gettext("conditions (rule)"))
        return format_html("<table>{}{}</table>", head, format_html("".join(["{}"] * len(rows)), *rows))

    def has_enrol_permission(self, request):
        """Minting a code or revoking a credential decides which machine gets the customers'
        SSH keys and connection lines: the node's and the agent's change permissions."""
        return request.user.has_perms(["inventory.change_node", "fleet.change_nodeagent"])

    @admin.action(description=_("New enrolment code (shown once)"), permissions=["enrol"])
    def enrolment_code(self, request, queryset):
        now = timezone.now()
        codes = [{"node": node, "code": enrolment_code_create(node=node, actor=request.user, now=now),
                  "expires_at": now + settings.NODE_ENROLMENT_CODE_TTL} for node in queryset]
        context = {**self.admin_site.each_context(request), "title": gettext("Enrolment codes"), "codes": codes,
                   "site_url": request.build_absolute_uri("/").rstrip("/")}
        request.current_app = self.admin_site.name
        # The codes live in this response only: never in a message, the session or a log.
        response = TemplateResponse(request, "admin/fleet/enrolment_codes.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description=_("Revoke the node agent's credential"), permissions=["enrol"])
    def revoke_credential(self, request, queryset):
        revoked = sum(node_credential_revoke(node=node, actor=request.user, now=timezone.now()) for node in queryset)
        self.message_user(request, gettext("%(count)s credential(s) revoked.") % {"count": revoked},
                          messages.SUCCESS)


if admin.site.is_registered(Node):
    admin.site.unregister(Node)
admin.site.register(Node, FleetNodeAdmin)


class InstanceReportInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = InstanceReport
    fields = ("node", "state", "ssh_port", "op_id", "error", "reported_at")
    verbose_name_plural = _("instance as reported by the nodes")


class EvidenceInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = Evidence
    fields = ("kind", "node", "op_id", "at", "received_at", "signature")
    verbose_name_plural = _("signed evidence from the nodes")


class FleetLeaseAdmin(LeaseAdmin):
    """The lease page, plus what its nodes reported and proved."""

    inlines = [*LeaseAdmin.inlines, InstanceReportInline, EvidenceInline]


admin.site.unregister(Lease)
admin.site.register(Lease, FleetLeaseAdmin)


@admin.register(NodeAgent)
class NodeAgentAdmin(ReadOnlyAdmin):
    list_display = ("node", "hostname", "agent_version", "enrolled_at", "last_report_at", "public_host",
                    "gpu_library", "last_seq", "revoked_at")
    search_fields = ("node__name", "hostname", "public_host")
    list_select_related = ("node",)
    exclude = ("credential_hash",)


@admin.register(Evidence)
class EvidenceAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "lease", "node", "op_id", "at", "received_at")
    list_filter = ("kind",)
    search_fields = ("lease__id", "node__name", "op_id")
    list_select_related = ("node", "lease__offer__gpu_model")


@admin.register(InstanceReport)
class InstanceReportAdmin(ReadOnlyAdmin):
    list_display = ("lease", "node", "state", "ssh_port", "op_id", "error", "reported_at")
    list_filter = ("state",)
    search_fields = ("lease__id", "node__name")
    list_select_related = ("node", "lease__offer__gpu_model")
