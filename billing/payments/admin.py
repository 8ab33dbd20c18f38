"""Operators' screens for crypto payments: rates (editable, dated on save), wallets with the
gap-limit warning, quotes with their payments and confirmations, payments, watcher cursors.
Status is read-only here: money moves only through billing.payments.services."""
from django import forms
from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.admin_base import ReadOnlyAdmin, ReadOnlyInlineMixin
from rental.admin import confirm_with_form, report

from ..admin import dollars
from ..models import (
    CoinRate,
    CoinRateGuard,
    CoinWallet,
    LatePaymentClaim,
    Payment,
    PaymentReview,
    Quote,
    WatcherCursor,
)
from ..services import BillingError
from .coins.amounts import format_amount
from .coins.base import Coin
from .config import gap_limit
from .credits import payment_review_close, payment_review_credit
from .pricing import PaymentError, coin_rate_set
from .services import wallet_gap_exceeded


def _coins(obj, value) -> str:
    """``obj`` has a ``coin`` (a quote or a payment)."""
    return f"{format_amount(int(value), Coin(obj.coin).decimals)} {obj.coin}"


@admin.register(CoinRate)
class CoinRateAdmin(admin.ModelAdmin):
    list_display = ("coin", "usd_per_coin", "source", "set_at", "age")
    fields = ("coin", "usd_per_coin", "source", "set_at")
    readonly_fields = ("set_at",)

    @admin.display(description=_("age"))
    def age(self, obj):
        minutes = int((timezone.now() - obj.set_at).total_seconds() // 60)
        return gettext("%(minutes)s min") % {"minutes": minutes}

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        try:
            saved = coin_rate_set(coin=obj.coin, usd_per_coin=obj.usd_per_coin, source=obj.source,
                                  actor=request.user, now=timezone.now())
        except PaymentError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        obj.pk, obj.set_at = saved.pk, saved.set_at


@admin.register(CoinRateGuard)
class CoinRateGuardAdmin(ReadOnlyAdmin):
    """The price guard per coin: the anchor, and while quoting is stopped, why and what the
    sources proposed (confirm a rate by setting it under Coin rates)."""

    list_display = ("coin", "stopped_at", "reason", "proposed_usd_per_coin", "proposed_source",
                    "anchor_usd_per_coin", "anchor_source", "anchor_at", "checked_at")


@admin.register(CoinWallet)
class CoinWalletAdmin(ReadOnlyAdmin):
    list_display = ("coin", "next_index", "highest_paid_index", "unpaid_gap", "gap_warning")

    @admin.display(description=_("unpaid addresses past the last paid one"))
    def unpaid_gap(self, obj):
        return max(obj.next_index - 1 - obj.highest_paid_index, 0)

    @admin.display(description=_("gap limit"))
    def gap_warning(self, obj):
        if wallet_gap_exceeded(obj):
            return format_html('<strong style="color:#b00">{}</strong>',
                               gettext("past %(limit)s: raise your wallet's gap limit") % {"limit": gap_limit()})
        return gettext("ok")


class PaymentInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = Payment
    fields = ("txid", "output_index", "amount_coins", "confirmations", "state", "invalid_reason", "block_height",
              "first_seen_at", "confirmed_at", "credited_cents", "credit_rate")

    @admin.display(description=_("amount"))
    def amount_coins(self, obj):
        return _coins(obj, obj.amount)


@admin.register(Quote)
class QuoteAdmin(ReadOnlyAdmin):
    list_display = ("id", "invoice", "coin", "state", "exception", "amount_coins", "received_coins",
                    "confirmed_coins", "usd_cents", "created_at", "expires_at")
    list_filter = ("coin", "state", "exception")
    search_fields = ("address", "reference", "payments__txid", "invoice__customer__username")
    list_select_related = ("invoice",)
    date_hierarchy = "created_at"
    inlines = [PaymentInline]

    @admin.display(description=_("amount"))
    def amount_coins(self, obj):
        return _coins(obj, obj.amount)

    @admin.display(description=_("received"))
    def received_coins(self, obj):
        return _coins(obj, obj.received)

    @admin.display(description=_("confirmed"))
    def confirmed_coins(self, obj):
        return _coins(obj, obj.confirmed)


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = ("id", "coin", "txid", "output_index", "quote", "amount_coins", "confirmations", "state",
                    "first_seen_at", "confirmed_at")
    list_filter = ("coin", "state")
    search_fields = ("txid", "address")
    list_select_related = ("quote",)

    @admin.display(description=_("amount"))
    def amount_coins(self, obj):
        return _coins(obj, obj.amount)


@admin.register(WatcherCursor)
class WatcherCursorAdmin(ReadOnlyAdmin):
    list_display = ("coin", "updated_at", "height", "last_ok_at", "tip_time", "last_error")

    @admin.display(description=_("height"))
    def height(self, obj):
        return obj.cursor.get("height", "—")


@admin.register(LatePaymentClaim)
class LatePaymentClaimAdmin(ReadOnlyAdmin):
    list_display = ("quote", "invoice", "at")
    list_select_related = ("quote", "invoice")


class CreditForm(forms.Form):
    confirm = forms.BooleanField(label=_("I checked the payment on the chain"),
                                 help_text=_("Credits what each review proposes (no rate then: today's rate)."))


@admin.register(PaymentReview)
class PaymentReviewAdmin(ReadOnlyAdmin):
    """Money held for an operator (no fresh rate, over the automatic cap) and payments
    reversed after settlement: credit them or close them with a reason."""

    list_display = ("id", "kind", "state", "quote", "customer", "amount_coins", "proposed", "clawed_back",
                    "created_at", "decided_by", "note")
    list_filter = ("state", "kind")
    list_select_related = ("quote__invoice__customer", "decided_by", "payment")
    search_fields = ("quote__address", "payment__txid", "quote__invoice__customer__username")
    actions = ["credit_reviews", "close_reviews"]

    @admin.display(description=_("customer"))
    def customer(self, obj):
        return obj.quote.invoice.customer

    @admin.display(description=_("amount"))
    def amount_coins(self, obj):
        return _coins(obj.quote, obj.amount)

    @admin.display(description=_("proposed credit"))
    def proposed(self, obj):
        return dollars(obj.proposed_cents) if obj.proposed_cents is not None else gettext("at today's rate")

    @admin.display(description=_("taken back"))
    def clawed_back(self, obj):
        return dollars(obj.clawed_back_cents)

    @admin.action(description=_("Credit to the customer's balance…"), permissions=["operate"])
    def credit_reviews(self, request, queryset):
        form, page = confirm_with_form(
            self, request, queryset, action="credit_reviews", title=gettext("Credit held payments"),
            warning=gettext("Each open review is credited to its customer's balance: the proposed amount, or the "
                            "coins at today's rate when there was no rate; a reversed payment gets back what was "
                            "taken."), confirm_label=gettext("Yes, credit"), form_class=CreditForm)
        if page:
            return page
        self._decide(request, queryset, lambda review: payment_review_credit(
            review=review, actor=request.user, now=timezone.now()), gettext("Credited: %(ids)s."))

    @admin.action(description=_("Close without a credit…"), permissions=["operate"])
    def close_reviews(self, request, queryset):
        form, page = confirm_with_form(
            self, request, queryset, action="close_reviews", title=gettext("Close reviews without a credit"),
            warning=gettext("Nothing is credited (e.g. refunded on-chain, or the lease was suspended); your reason "
                            "is kept on each review."), confirm_label=gettext("Yes, close"))
        if page:
            return page
        self._decide(request, queryset, lambda review: payment_review_close(
            review=review, actor=request.user, now=timezone.now(), note=form.cleaned_data["reason"]),
            gettext("Closed: %(ids)s."))

    def _decide(self, request, queryset, decide, done_message):
        done, refused = [], []
        for review in queryset:
            try:
                decide(review)
            except BillingError as exc:
                refused.append((review.pk, str(exc)))
            else:
                done.append(review.pk)
        report(self, request, done_message=done_message, refused_message=gettext("#%(id)s not decided: %(why)s"),
               done=done, refused=refused)
