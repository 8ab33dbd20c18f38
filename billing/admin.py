"""Operators' screens for money. Invoices are read-only apart from the "settle manually"
action (a note is required and recorded with the operator); the ledger, accounts and job
runs are read-only audit views."""
from django import forms
from django.contrib import admin
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.admin_base import ReadOnlyAdmin, ReadOnlyInlineMixin
from rental.admin import confirm_with_form, report

from .models import Account, Invoice, InvoiceLine, JobRun, LedgerEntry
from .services import BillingError, invoice_settle_manually


def dollars(cents) -> str:
    return "" if cents is None else f"${cents / 100:,.2f}"


class InvoiceLineInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = InvoiceLine
    fields = ("description", "quantity", "unit_cents", "amount_cents")


class SettlementForm(forms.Form):
    note = forms.CharField(max_length=300, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                           label=_("Note"),
                           help_text=_("Why and how it was paid (e.g. bank transfer reference). Kept on the invoice."))


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "kind", "state", "amount", "lease", "term_start", "created_at", "expires_at",
                    "paid_at", "paid_via", "settled_by", "flag")
    list_filter = ("state", "kind", "paid_via", "flag")
    list_select_related = ("customer", "settled_by", "lease__offer__gpu_model")
    search_fields = ("customer__username", "note")
    search_help_text = _("Invoice id (e.g. 42 or #42), customer username or note")
    ordering = ("-created_at", "-id")
    inlines = [InvoiceLineInline]
    actions = ["settle_manually"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Invoice._meta.fields] + ["amount"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description=_("amount"), ordering="amount_cents")
    def amount(self, obj):
        return dollars(obj.amount_cents)

    @admin.action(description=_("Settle manually (paid outside the platform)…"), permissions=["change"])
    def settle_manually(self, request, queryset):
        form, page = confirm_with_form(
            self, request, queryset, action="settle_manually", title=gettext("Settle invoices manually"),
            warning=gettext("Each open invoice is marked paid (via 'manual') with your note, and its lease gets its "
                            "term; a payment for a lease that has ended goes to the customer's balance."),
            confirm_label=gettext("Yes, mark paid"), form_class=SettlementForm)
        if page:
            return page
        done, refused = [], []
        for invoice in queryset:
            try:
                ok = invoice_settle_manually(invoice=invoice, actor=request.user, note=form.cleaned_data["note"])
            except BillingError as exc:
                ok, why = False, str(exc)
            else:
                why = gettext("it is %(state)s, not open") % {"state": invoice.get_state_display()}
            (done.append(invoice.pk) if ok else refused.append((invoice.pk, why)))
        report(self, request, done_message=gettext("Settled: %(ids)s."),
               refused_message=gettext("#%(id)s not settled: %(why)s"), done=done, refused=refused)


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ("customer", "balance")
    search_fields = ("customer__username",)
    list_select_related = ("customer",)

    @admin.display(description=_("balance"), ordering="balance_cents")
    def balance(self, obj):
        return dollars(obj.balance_cents)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "account", "kind", "amount", "balance_after", "invoice_id", "actor", "memo")
    list_filter = ("kind",)
    search_fields = ("account__customer__username", "memo", "idempotency_key")
    list_select_related = ("account__customer", "actor")
    date_hierarchy = "at"

    @admin.display(description=_("amount"), ordering="amount_cents")
    def amount(self, obj):
        return dollars(obj.amount_cents)

    @admin.display(description=_("balance after"))
    def balance_after(self, obj):
        return dollars(obj.balance_after_cents)


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdmin):
    list_display = ("name", "last_started_at", "last_finished_at", "last_result")
