from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Exists, OuterRef, Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.admin_base import ReadOnlyAdmin, ReadOnlyInlineMixin

from .burnin import burn_in_request_node
from .incidents import IncidentRefused, incident_close, incident_open
from .models import (
    AuditEntry,
    BurnIn,
    Downtime,
    GpuModel,
    GpuSlot,
    Incident,
    Interconnect,
    Node,
    Offer,
    Site,
    SlotAllocation,
    StorageProduct,
)
from .selectors import SELLABLE_SLOT, nodes_with_free_counts
from .services import NodeRefused, node_save, node_set_draining


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ("code", "name", "region", "infiniband", "is_active")
    list_filter = ("is_active", "infiniband", "region")
    search_fields = ("code", "name")


@admin.register(Interconnect)
class InterconnectAdmin(admin.ModelAdmin):
    list_display = ("link", "cards", "bandwidth", "sharding", "sort")
    list_filter = ("sharding",)
    search_fields = ("cards", "link")


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ("name", "vendor", "vram_gb", "memory_type", "interconnect", "fp8", "included_nvme_gb", "free_now")
    list_filter = ("vendor", "fp8", "interconnect")
    search_fields = ("name", "slug")

    def get_queryset(self, request):
        open_alloc = SlotAllocation.objects.filter(slot=OuterRef("pk"), released_at__isnull=True)
        free = GpuSlot.objects.filter(**SELLABLE_SLOT, node__draining=False).exclude(Exists(open_alloc))
        return super().get_queryset(request).annotate(
            _free=Count("nodes__slots", filter=Q(nodes__slots__in=free), distinct=True)
        )

    @admin.display(description=_("free now"), ordering="_free")
    def free_now(self, obj):
        return obj._free


@admin.register(Offer)
class OfferAdmin(admin.ModelAdmin):
    list_display = ("display_name", "gpu_model", "gpu_count", "weekly_cents", "monthly_cents", "is_active")
    list_filter = ("is_active", "gpu_count", "gpu_model__vendor")
    search_fields = ("slug", "name", "gpu_model__name")
    list_select_related = ("gpu_model",)


class GpuSlotInline(admin.TabularInline):
    """Slots are made from the node's GPU count (inventory.services.node_save); here the
    operator only takes a card in or out of service."""
    model = GpuSlot
    extra = 0
    max_num = 0
    can_delete = False
    fields = ("index", "in_service", "burn_in_due", "burn_in_passed_at", "health_hold")
    readonly_fields = ("index", "burn_in_due", "burn_in_passed_at", "health_hold")


class NodeForm(forms.ModelForm):
    class Meta:
        model = Node
        fields = "__all__"

    def clean_gpu_count(self):
        count = self.cleaned_data["gpu_count"]
        if not 1 <= count <= 8:
            raise forms.ValidationError(_("A node has 1 to 8 GPUs."))
        if self.instance.pk and SlotAllocation.objects.filter(slot__node=self.instance, slot__index__gte=count).exists():
            raise forms.ValidationError(_("Slots beyond %(n)s have had leases: drain the node instead of "
                                          "removing them.") % {"n": count})
        return count


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    form = NodeForm
    list_display = ("name", "site", "gpu_model", "gpu_count", "free_slots", "vcpus", "host_ram_gb", "draining")
    list_filter = ("site", "gpu_model", "draining")
    search_fields = ("name",)
    readonly_fields = ("draining", "leases_here", "burn_in_required", "nvlink_reported")
    inlines = [GpuSlotInline]
    actions = ["drain", "undrain", "burn_in"]

    @admin.display(description=_("leases on this node"))
    def leases_here(self, obj):
        """Every live lease holding a slot of this node, with its slots."""
        if obj is None or obj.pk is None:
            return "—"
        held: dict[int, list[int]] = {}
        for lease_id, index in (SlotAllocation.objects.filter(slot__node=obj, released_at__isnull=True)
                                .order_by("lease_id", "slot__index").values_list("lease_id", "slot__index")):
            held.setdefault(lease_id, []).append(index)
        if not held:
            return gettext("none")
        return format_html_join(", ", '<a href="{}">#{}</a> ({})', (
            (reverse("admin:rental_lease_change", args=[lease_id]), lease_id,
             ", ".join(f"gpu{i}" for i in indexes)) for lease_id, indexes in held.items()))

    def get_queryset(self, request):
        return nodes_with_free_counts()

    def save_model(self, request, obj, form, change):
        """Through node_save: slots follow the GPU count, and the change is audited."""
        changed = {f: (form.initial.get(f), form.cleaned_data.get(f)) for f in form.changed_data}
        try:
            node_save(node=obj, actor=request.user, changed=changed)
        except NodeRefused as exc:
            self.message_user(request, str(exc), messages.ERROR)

    @admin.display(description=_("free"), ordering="free")
    def free_slots(self, obj):
        return obj.free

    @admin.action(description=_("Drain: take no new leases on the selected nodes"), permissions=["change"])
    def drain(self, request, queryset):
        for node in queryset:
            node_set_draining(node=node, draining=True, actor=request.user, reason="admin action")
        self.message_user(request, gettext("%(count)s node(s) draining.") % {"count": queryset.count()},
                          messages.SUCCESS)

    @admin.action(description=_("Undrain: take new leases again"), permissions=["change"])
    def undrain(self, request, queryset):
        for node in queryset:
            node_set_draining(node=node, draining=False, actor=request.user, reason="admin action")
        self.message_user(request, gettext("%(count)s node(s) back in service.") % {"count": queryset.count()},
                          messages.SUCCESS)


    @admin.action(description=_("Burn-in: test the idle cards of the selected nodes now"), permissions=["change"])
    def burn_in(self, request, queryset):
        asked = [b for node in queryset for b in burn_in_request_node(
            node=node, reason=BurnIn.Reason.OPERATOR, now=timezone.now(), actor=request.user)]
        self.message_user(request, gettext("Burn-in asked for %(count)s idle card(s); they are out of stock "
                                           "until they pass.") % {"count": len(asked)}, messages.SUCCESS)


@admin.register(BurnIn)
class BurnInAdmin(ReadOnlyAdmin):
    list_display = ("op_id", "slot", "reason", "requested_at", "finished_at", "result")
    list_filter = ("result", "reason")
    search_fields = ("op_id", "slot__node__name")
    list_select_related = ("slot__node",)
    readonly_fields = ("checks_figures",)

    @admin.display(description=_("checks (figures as the node signed them)"))
    def checks_figures(self, obj):
        """The signed record's depth, class and each check of every level with its
        figures (nodeagent/gpu_checks.py); a record from an agent before them has none."""
        record = obj.record or {}
        head = format_html_join("", "<p>{}: {} · {}: {} · {}: {}</p>", [(
            gettext("depth"), record.get("depth", "—"), gettext("card class"), record.get("card_class", "—"),
            gettext("DCGM level"), record.get("level", "—"))])
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", [
            (c.get("name", "?"), c.get("status", "?"),
             ", ".join(f"{k} {v}" for k, v in sorted((c.get("figures") or {}).items())), c.get("detail", ""))
            for c in record.get("checks") or [] if isinstance(c, dict)])
        return head + format_html_join("", "<table>{}</table>", [(rows,)]) if rows else head


@admin.register(SlotAllocation)
class SlotAllocationAdmin(ReadOnlyAdmin):
    list_display = ("slot", "lease_id", "allocated_at", "released_at")
    list_filter = (("released_at", admin.EmptyFieldListFilter),)
    search_fields = ("lease_id", "slot__node__name")
    list_select_related = ("slot__node",)


@admin.register(StorageProduct)
class StorageProductAdmin(admin.ModelAdmin):
    list_display = ("kind", "cents_per_tb_month", "included_tb", "max_tb")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "action", "object_type", "object_id")
    list_select_related = ("actor",)
    list_filter = ("action", "object_type")
    search_fields = ("object_id", "action")


# --- incidents ----------------------------------------------------------------------------

class IncidentForm(forms.ModelForm):
    class Meta:
        model = Incident
        fields = ("site", "node", "slot", "kind", "starts_at", "ends_at", "reason")

    def clean(self):
        data = super().clean()
        if sum(bool(data.get(k)) for k in ("site", "node", "slot")) != 1:
            raise forms.ValidationError(gettext("Pick exactly one of site, node or GPU slot."))
        starts, ends = data.get("starts_at"), data.get("ends_at")
        if starts and starts > timezone.now():
            raise forms.ValidationError(gettext("An incident cannot start in the future."))
        if starts and ends and ends < starts:
            raise forms.ValidationError(gettext("An incident cannot end before it starts."))
        return data

    #: the model's constraints in words (Django says "Constraint “…” is violated.")
    CONSTRAINT_SENTENCES = {"incident_exactly_one_scope": _("Pick exactly one of site, node or GPU slot."),
                            "incident_ends_after_start": _("An incident cannot end before it starts.")}

    def _post_clean(self):
        super()._post_clean()
        errors = self._errors.get(forms.forms.NON_FIELD_ERRORS) if self._errors else None
        if not errors:
            return
        sentences = []
        for error in errors.as_data():
            for message in error.messages:
                for name, sentence in self.CONSTRAINT_SENTENCES.items():
                    if f"“{name}”" in message or f'"{name}"' in message:
                        message = str(sentence)
                if message not in sentences:
                    sentences.append(message)
        self._errors[forms.forms.NON_FIELD_ERRORS] = self.error_class(sentences, error_class="nonfield",
                                                                      renderer=self.renderer)


class DowntimeInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = Downtime
    fields = ("lease_id", "kind", "starts_at", "ends_at")


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    """Opening an incident takes its slots out of stock and records downtime for the leases
    on them (inventory.incidents); closing returns the slots. Rows are never edited."""

    form = IncidentForm
    list_display = ("id", "scope", "kind", "source", "starts_at", "ends_at", "reason", "created_by")
    list_filter = ("kind", "source", ("ends_at", admin.EmptyFieldListFilter), "site", "node__site")
    search_fields = ("reason", "node__name", "slot__node__name", "site__code")
    list_select_related = ("site", "node", "slot__node", "created_by")
    raw_id_fields = ("node", "slot")
    inlines = [DowntimeInline]
    actions = ["close_now"]

    @admin.display(description=_("scope"))
    def scope(self, obj):
        return obj.scope_label

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("site", "node", "slot", "kind", "source", "starts_at", "ends_at", "reason", "created_by",
                "closed_by")

    def get_fields(self, request, obj=None):
        if obj is None:
            return IncidentForm.Meta.fields
        return self.get_readonly_fields(request, obj)

    def get_changeform_initial_data(self, request):
        return {"starts_at": timezone.now().replace(microsecond=0), **super().get_changeform_initial_data(request)}

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        if change:
            return
        data = form.cleaned_data
        try:
            incident = incident_open(site=data.get("site"), node=data.get("node"), slot=data.get("slot"),
                                     kind=data["kind"], starts_at=data["starts_at"], ends_at=data.get("ends_at"),
                                     reason=data["reason"], actor=request.user)
        except IncidentRefused as exc:  # form validation catches these first
            self.message_user(request, str(exc), messages.ERROR)
            raise
        obj.pk = incident.pk
        obj._state.adding = False

    @admin.action(description=_("Close now: end the downtime, return the slots to service"), permissions=["change"])
    def close_now(self, request, queryset):
        closed = [i.pk for i in queryset if incident_close(incident=i, actor=request.user, reason="closed in admin")]
        ids = ", ".join(f"#{pk}" for pk in closed) or gettext("none")
        self.message_user(request, gettext("Closed incident(s): %(ids)s (already closed ones are left as they "
                                           "were).") % {"ids": ids}, messages.SUCCESS)


@admin.register(Downtime)
class DowntimeAdmin(ReadOnlyAdmin):
    list_display = ("lease_id", "incident", "kind", "starts_at", "ends_at")
    list_filter = ("kind", ("ends_at", admin.EmptyFieldListFilter))
    search_fields = ("lease_id",)
    list_select_related = ("incident__site", "incident__node", "incident__slot__node")
