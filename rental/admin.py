"""Operators' screens for leases. Status and deadlines are read-only: every change is an
admin action that calls a service in rental.services, which writes the LeaseEvent with
the operator as actor. Suspend and release ask for a reason on a confirmation page."""
from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Q
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.admin_base import ReadOnlyAdmin, ReadOnlyInlineMixin

from . import rules, services
from .models import (
    WIPE_PENDING,
    DiskKey,
    Image,
    Lease,
    LeaseEvent,
    LeaseState,
    Notification,
)
from .permissions import ops_view
from .timeline import lease_milestones
from .transitions import TransitionRefused

S = LeaseState

# --- a reusable "confirm with a reason" page for admin actions ---------------------------

CONFIRM_TEMPLATE = engines["django"].from_string("""{% extends "admin/base_site.html" %}{% load i18n admin_urls %}
{% block breadcrumbs %}<div class="breadcrumbs"><a href="{% url 'admin:index' %}">{% translate "Home" %}</a>
&rsaquo; <a href="{% url opts|admin_urlname:'changelist' %}">{{ opts.verbose_name_plural|capfirst }}</a>
&rsaquo; {{ title }}</div>{% endblock %}
{% block content %}
<p>{{ warning }}</p>
<ul>{% for obj in objects %}<li>{{ obj }}</li>{% endfor %}</ul>
<form method="post">{% csrf_token %}
  {{ form.as_p }}
  {% for obj in objects %}<input type="hidden" name="{{ checkbox_name }}" value="{{ obj.pk }}">{% endfor %}
  <input type="hidden" name="action" value="{{ action }}">
  <input type="hidden" name="post" value="yes">
  <input type="submit" value="{{ confirm_label }}">
  <a href="" class="button cancel-link">{% translate "No, take me back" %}</a>
</form>
{% endblock %}""")


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=300, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             label=_("Reason"), help_text=_("Recorded in the audit trail with your name."))


def confirm_with_form(modeladmin, request, queryset, *, action: str, title: str, warning: str,
                      confirm_label: str, form_class=ReasonForm):
    """The admin-action confirmation pattern: the first POST shows a page with a form; the
    second (with `post`) returns the bound, valid form, or None while the page is shown."""
    form = form_class(request.POST if request.POST.get("post") else None)
    if request.POST.get("post") and form.is_valid():
        return form, None
    context = {
        **modeladmin.admin_site.each_context(request),
        "opts": modeladmin.model._meta, "title": title, "warning": warning, "objects": list(queryset),
        "form": form, "action": action, "confirm_label": confirm_label,
        "checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    request.current_app = modeladmin.admin_site.name
    return None, TemplateResponse(request, CONFIRM_TEMPLATE, context)


def report(modeladmin, request, *, done_message: str, refused_message: str, done: list, refused: list) -> None:
    """done_message has %(ids)s ("Extended: %(ids)s."); refused_message has %(id)s and %(why)s."""
    if done:
        modeladmin.message_user(request, done_message % {"ids": ", ".join(f"#{pk}" for pk in done)},
                                messages.SUCCESS)
    for pk, why in refused:
        modeladmin.message_user(request, refused_message % {"id": pk, "why": why}, messages.WARNING)


# --- leases -------------------------------------------------------------------------------

class DeadlineFilter(admin.SimpleListFilter):
    title = _("deadline")
    parameter_name = "deadline"

    def lookups(self, request, model_admin):
        return [("ends_renewal", _("ends within %(hours)s h (renewal invoiced)")
                 % {"hours": settings.LEASE_RENEWAL_LEAD_HOURS}),
                ("ends_hold", _("ends within %(hours)s h") % {"hours": settings.LEASE_HOLD_HOURS}),
                ("hold_24h", _("hold expires within 24 h")), ("wipe_due", _("wipe overdue"))]

    def queryset(self, request, queryset):
        now = timezone.now()
        match self.value():
            case "ends_renewal":  # the renewal invoice is out (or due)
                return queryset.filter(state=S.ACTIVE, ends_at__lte=now + rules.renewal_lead())
            case "ends_hold":
                return queryset.filter(state=S.ACTIVE, ends_at__lte=now + rules.hold())
            case "hold_24h":
                return queryset.filter(state=S.SUSPENDED, hold_until__lte=now + timedelta(hours=24))
            case "wipe_due":  # past the wipe deadline and still not wiped: an alert
                return queryset.filter(WIPE_PENDING, wipe_by__lte=now)
        return queryset


class LeaseEventInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = LeaseEvent
    fields = ("at", "kind", "from_state", "to_state", "actor", "reason", "data")
    show_change_link = False


class DiskKeyInline(ReadOnlyInlineMixin, admin.StackedInline):
    model = DiskKey
    fields = ("key_ref", "state", "created_at", "destroy_requested_at", "destroy_requested_by", "destroy_reason",
              "destroyed_at", "destruction_proof")


def lease_timeline(lease: Lease, now) -> list[tuple]:
    """(when, what, source) rows: the deadlines (set or projected) and the events, in order."""
    rows = [(lease.created_at, gettext("ordered"), "deadline")]
    if lease.state == S.PENDING:
        rows.append((lease.pay_by, gettext("payment window closes (slots held until then)"), "deadline"))
    if lease.started_at:
        rows.append((lease.started_at, gettext("first term started"), "deadline"))
    if lease.ends_at and lease.state in (S.PROVISIONING, S.ACTIVE, S.SUSPENDED):
        # The same milestones as the customer's timeline (one source: rental.rules).
        rows += [(m.at, str(m.label), "deadline") for m in lease_milestones(lease, now)
                 if m.key not in ("ordered", "start")]
    elif lease.wipe_by and lease.state != S.WIPED:
        rows.append((lease.wipe_by, gettext("local NVMe wiped (by)"), "deadline"))
    for event in lease.events.select_related("actor"):
        who = gettext(" by %(actor)s") % {"actor": event.actor} if event.actor else ""
        arrow = f" ({event.from_state} → {event.to_state})" if event.to_state and event.from_state != event.to_state \
            else ""
        rows.append((event.at, f"{event.kind}{arrow}{who}{': ' + event.reason if event.reason else ''}", "event"))
    return sorted(rows, key=lambda r: r[0])


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "offer", "site", "state", "term", "pay_by", "ends_at", "hold_until",
                    "wipe_by", "created_at")
    list_filter = ("state", "site", "offer", DeadlineFilter, "term")
    list_select_related = ("customer", "offer__gpu_model", "site")
    search_fields = ("customer__username",)
    search_help_text = _("Lease id (e.g. 42 or #42) or customer username")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    inlines = [DiskKeyInline, LeaseEventInline]
    actions = ["extend_free", "suspend_now", "resume", "release"]
    fieldsets = [
        (None, {"fields": ("customer", "offer", "site", "hardware", "image", "term", "state", "price_cents",
                           ("extra_nvme_tb", "network_volume_tb", "snapshot_tb"), "ssh_public_key",
                           ("host", "ssh_port"))}),
        (_("Deadlines (UTC)"), {"fields": ("created_at", "pay_by", "provisioning_started_at", "started_at", "ends_at",
                                        "hold_until", "wipe_by", "ended_at")}),
        (_("Timeline"), {"fields": ("timeline",)}),
    ]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Lease._meta.fields] + ["timeline", "hardware"]

    @admin.display(description=_("node and GPU slots"))
    def hardware(self, obj):
        """Where the lease runs now (and ran before a migration), linked to the node."""
        from inventory.models import SlotAllocation

        rows = (SlotAllocation.objects.filter(lease_id=obj.pk).select_related("slot__node")
                .order_by("released_at", "slot__node__name", "slot__index"))
        now_on: dict = {}
        before: dict = {}
        for alloc in rows:
            (before if alloc.released_at else now_on).setdefault(alloc.slot.node, []).append(alloc.slot.index)
        def fmt(groups):
            return format_html_join(", ", '<a href="{}">{}</a>: {}', (
                (reverse("admin:inventory_node_change", args=[node.pk]), node.name,
                 ", ".join(f"gpu{i}" for i in indexes)) for node, indexes in groups.items()))
        if not now_on and not before:
            return gettext("no GPU slot held")
        parts = [fmt(now_on) if now_on else gettext("none now")]
        if before:
            parts.append(format_html(" <span class=\"help\">({} {})</span>", gettext("before:"), fmt(before)))
        return format_html("{}{}", parts[0], parts[1] if len(parts) > 1 else "")

    def has_add_permission(self, request):
        return False  # leases are ordered through checkout, never typed in

    def has_delete_permission(self, request, obj=None):
        return False

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            return queryset.filter(Q(pk=int(term)) | Q(customer__username=term)), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description=_("timeline"))
    def timeline(self, obj):
        now = timezone.now()
        rows = lease_timeline(obj, now)
        labels = {"deadline": gettext("deadline"), "event": gettext("event"), "due": gettext("due")}
        body = format_html_join(
            "", '<tr class="{} {}"><td>{}</td><td>{}</td><td>{}</td></tr>',
            ((src, "past" if at <= now else "upcoming", f"{at:%Y-%m-%d %H:%M}",
              labels[src if at <= now or src == "event" else "due"], what) for at, what, src in rows))
        return format_html('<table class="lease-timeline"><thead><tr><th>{}</th><th></th><th>{}</th>'
                           '</tr></thead><tbody>{}</tbody></table>', gettext("when (UTC)"), gettext("what"), body)

    # Each action calls a service; the service writes the LeaseEvent with the operator as actor.

    @admin.action(description=_("Extend by one term, free of charge"), permissions=["change"])
    def extend_free(self, request, queryset):
        done, refused, now = [], [], timezone.now()
        for lease in queryset:
            try:
                ok = services.lease_extend_by_operator(lease_id=lease.pk, actor=request.user, now=now,
                                                       reason=f"extended free of charge by {request.user} (admin)")
            except TransitionRefused as exc:
                refused.append((lease.pk, str(exc)))
                continue
            (done if ok else refused).append(lease.pk if ok else (lease.pk, gettext("changed meanwhile, try again")))
        report(self, request, done_message=gettext("Extended: %(ids)s."),
               refused_message=gettext("#%(id)s not extended: %(why)s"), done=done, refused=refused)

    @admin.action(description=_("Suspend now (stop the instance, hold the slots)…"), permissions=["change"])
    def suspend_now(self, request, queryset):
        form, page = confirm_with_form(
            self, request, queryset, action="suspend_now", title=gettext("Suspend leases now"),
            warning=gettext("The instances are stopped at once and their slots held for %(hours)s hours after the "
                            "paid term ends; unless resumed or paid, the leases are then released and their disk "
                            "keys destroyed.") % {"hours": settings.LEASE_HOLD_HOURS},
            confirm_label=gettext("Yes, suspend"))
        if page:
            return page
        done, refused, now = [], [], timezone.now()
        for lease in queryset:
            if services.lease_suspend(lease_id=lease.pk, now=now, actor=request.user, force=True,
                                      reason=form.cleaned_data["reason"]):
                done.append(lease.pk)
            else:
                refused.append((lease.pk, gettext("only an active lease can be suspended (it is %(state)s)")
                                % {"state": lease.state}))
        report(self, request, done_message=gettext("Suspended: %(ids)s."),
               refused_message=gettext("#%(id)s not suspended: %(why)s"), done=done, refused=refused)

    @admin.action(description=_("Resume (suspended leases whose term is still running)"), permissions=["change"])
    def resume(self, request, queryset):
        done, refused, now = [], [], timezone.now()
        for lease in queryset:
            if services.lease_resume(lease_id=lease.pk, now=now, actor=request.user,
                                     reason=f"resumed by {request.user} (admin)"):
                done.append(lease.pk)
            else:
                refused.append((lease.pk, gettext("only a suspended lease whose term has not ended can be resumed")))
        report(self, request, done_message=gettext("Resumed: %(ids)s."),
               refused_message=gettext("#%(id)s not resumed: %(why)s"), done=done, refused=refused)

    @admin.action(description=_("Release now (free slots, destroy the disk key)…"), permissions=["change"])
    def release(self, request, queryset):
        form, page = confirm_with_form(
            self, request, queryset, action="release", title=gettext("Release leases now"),
            warning=gettext("Releasing returns the slots to stock and destroys each lease's NVMe encryption key. "
                            "This cannot be undone. Only suspended leases can be released."),
            confirm_label=gettext("Yes, release and destroy the keys"))
        if page:
            return page
        done, refused, now = [], [], timezone.now()
        for lease in queryset:
            try:
                ok = services.lease_release(lease_id=lease.pk, now=now, actor=request.user, force=True,
                                            reason=form.cleaned_data["reason"])
            except TransitionRefused as exc:
                ok, why = False, str(exc)
            else:
                why = gettext("only a suspended lease can be released (it is %(state)s)") % {"state": lease.state}
            (done.append(lease.pk) if ok else refused.append((lease.pk, why)))
        report(self, request, done_message=gettext("Released: %(ids)s."),
               refused_message=gettext("#%(id)s not released: %(why)s"), done=done, refused=refused)


# --- audit trail, images ------------------------------------------------------------------

@admin.register(LeaseEvent)
class LeaseEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "lease_id", "kind", "from_state", "to_state", "actor", "reason")
    list_filter = ("kind", "to_state")
    search_fields = ("kind", "reason", "actor__username")
    list_select_related = ("actor",)
    date_hierarchy = "at"

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            return queryset.filter(lease_id=int(term)), False
        return super().get_search_results(request, queryset, search_term)


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "lease_id", "customer", "kind", "deadline", "subject", "emailed_at", "read_at")
    list_filter = ("kind", ("emailed_at", admin.EmptyFieldListFilter))
    search_fields = ("customer__username", "subject")
    list_select_related = ("customer",)


class ImageTemplateForm(forms.ModelForm):
    """A template's image reference, ports, variables and generated secret checked as a
    customer's are (rental.workbench), so a template cannot send a node what an order could not."""

    class Meta:
        model = Image
        fields = "__all__"

    def clean(self):
        from .workbench_rules import (
            clean_ports,
            env_name_problems,
            image_ref_problems,
            variables_problems,
        )

        data = super().clean()
        problems = image_ref_problems(data["image_ref"]) if data.get("image_ref") else []
        ports = data.get("ports") or []
        _clean, port_problems = clean_ports(ports) if isinstance(ports, list) else ([], [])
        if not isinstance(ports, list) or port_problems or any(type(p) is not int for p in ports):
            self.add_error("ports", [p.message for p in port_problems] or "[8888, 6006]")
        problems += variables_problems(data.get("env") or {}, "env")
        if data.get("generated_secret"):
            problems += env_name_problems(data["generated_secret"], "generated_secret")
        for problem in problems:
            self.add_error(problem.field if problem.field in self.fields else None, problem.message)
        return data


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    form = ImageTemplateForm
    list_display = ("name", "slug", "vendor", "image_ref", "is_active")
    list_filter = ("vendor", "is_active")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}


from .notifications import admin as _notifications_admin  # noqa: E402,F401 (registers its screens)


# --- django-axes' lockouts: its clean-up action deletes rows, so it needs the
# delete permission (axes declares none: any staff who may view lockouts could run it).
def _guard_axes_admin():
    from axes.admin import AccessAttemptAdmin
    from axes.models import AccessAttempt

    class GuardedAccessAttemptAdmin(AccessAttemptAdmin):
        @admin.action(description=_("Clean up expired attempts"), permissions=["delete"])
        def cleanup_expired_attempts(self, request, queryset):
            return AccessAttemptAdmin.cleanup_expired_attempts(self, request, queryset)

    if admin.site.is_registered(AccessAttempt):
        admin.site.unregister(AccessAttempt)
        admin.site.register(AccessAttempt, GuardedAccessAttemptAdmin)


# django-otp's pages showing an authenticator's secret (its QR code and otpauth:// URL) open
# with the view permission: whoever sees the secret makes the codes. They need the change one.
TOTP_SECRET_VIEWS = {"otp_totp_totpdevice_config", "otp_totp_totpdevice_qrcode"}


def _guard_totp_admin():
    from django_otp.plugins.otp_totp.admin import TOTPDeviceAdmin
    from django_otp.plugins.otp_totp.models import TOTPDevice

    class GuardedTOTPDeviceAdmin(TOTPDeviceAdmin):
        def get_urls(self):
            urls = super().get_urls()
            for url in urls:
                if url.name in TOTP_SECRET_VIEWS:
                    url.callback = ops_view(read="otp_totp.change_totpdevice")(url.callback)
            return urls

    if admin.site.is_registered(TOTPDevice):
        admin.site.unregister(TOTPDevice)
        admin.site.register(TOTPDevice, GuardedTOTPDeviceAdmin)


_guard_axes_admin()
_guard_totp_admin()
