"""Operators' screens for crypto payments: rates (editable, dated on save), wallets with the
gap-limit warning, quotes with their payments and confirmations, payments, watcher cursors.
Status is read-only here: money moves only through billing.payments.services."""
from django.contrib import admin, messages
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from inventory.admin_base import ReadOnlyAdmin, ReadOnlyInlineMixin

from ..models import CoinRate, CoinWallet, LatePaymentClaim, Payment, Quote, WatcherCursor
from .coins.amounts import format_amount
from .coins.base import Coin
from .config import gap_limit
from .services import PaymentError, coin_rate_set, wallet_gap_exceeded


def _coins(obj, value) -> str:
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
    fields = ("txid", "output_index", "amount_coins", "confirmations", "state", "block_height", "first_seen_at",
              "confirmed_at")

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
    list_display = ("coin", "updated_at", "height")

    @admin.display(description=_("height"))
    def height(self, obj):
        return obj.cursor.get("height", "—")


@admin.register(LatePaymentClaim)
class LatePaymentClaimAdmin(ReadOnlyAdmin):
    list_display = ("quote", "invoice", "at")
    list_select_related = ("quote", "invoice")
