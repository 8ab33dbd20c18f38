"""Reads for the payment pages: the customer's quotes, and a quote's display values
(exact decimal amounts, what is still due, time left, the QR code of its payment URI)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import segno
from django.db.models import QuerySet
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext, ngettext

from core.money import format_usd

from ..models import Invoice, Payment, PaymentReview, Quote
from .coins.amounts import format_amount
from .coins.base import COIN_SPECS, Coin
from .late import late_payment_claimable
from .services import amount_due_min, coins_offered

FINAL_STATES = (Quote.State.SETTLED, Quote.State.EXPIRED, Quote.State.INVALID)


def customer_invoices(user) -> QuerySet[Invoice]:
    return Invoice.objects.filter(customer=user).select_related("lease__offer__gpu_model")


def customer_quotes(user) -> QuerySet[Quote]:
    return Quote.objects.filter(invoice__customer=user).select_related("invoice__lease")


@dataclass(frozen=True)
class CoinChoice:
    code: str
    name: str


def coin_choices(customer=None) -> list[CoinChoice]:
    return [CoinChoice(str(c), COIN_SPECS[c].name) for c in coins_offered(customer=customer)]


@dataclass(frozen=True)
class QuoteView:
    quote: Quote
    amount: str
    received: str
    confirmed: str
    still_due: str | None
    rate: str
    seconds_left: int
    time_left: str
    final: bool
    can_confirm_late: bool
    qr_svg: SafeString
    payments: list[PaymentLine]


@dataclass(frozen=True)
class PaymentLine:
    """One payment to the quote and what it did with the money, in the customer's words."""

    txid: str
    amount: str
    confirmations: int
    outcome: str


def quote_view(quote: Quote, now: datetime) -> QuoteView:
    decimals = Coin(quote.coin).decimals
    due = max(int(quote.amount) - int(quote.received), 0)
    partial = 0 < int(quote.received) < amount_due_min(quote)
    return QuoteView(
        quote=quote,
        amount=format_amount(int(quote.amount), decimals),
        received=format_amount(int(quote.received), decimals),
        confirmed=format_amount(int(quote.confirmed), decimals),
        still_due=format_amount(due, decimals) if partial else None,
        rate=format(quote.rate_usd_per_coin.normalize(), "f"),
        seconds_left=max(int((quote.expires_at - now).total_seconds()), 0),
        time_left=time_left(quote.expires_at, now),
        final=quote.state in FINAL_STATES,
        can_confirm_late=late_payment_claimable(quote),
        qr_svg=qr_svg(quote.uri),
        payments=payment_lines(quote),
    )


def payment_lines(quote: Quote) -> list[PaymentLine]:
    decimals = Coin(quote.coin).decimals
    held = set(quote.reviews.filter(state=PaymentReview.State.OPEN).values_list("payment_id", flat=True))
    return [PaymentLine(p.txid, format_amount(int(p.amount), decimals), p.confirmations,
                        _outcome(quote, p, held)) for p in quote.payments.order_by("first_seen_at", "pk")]


def _outcome(quote: Quote, p: Payment, held: set) -> str:
    if p.state in (Payment.State.REORGED, Payment.State.INVALID):
        return gettext("no longer counts: %(why)s") % {"why": p.get_state_display()}
    if p.pk in held:
        return gettext("held for review by our staff before it is credited; we will be in touch")
    if p.credited_cents:
        assert p.credit_rate is not None  # a credited payment records its rate (credits.py)
        if p.credit_rate == quote.rate_usd_per_coin:
            return gettext("credited %(usd)s to your balance at the quoted rate") % {
                "usd": format_usd(p.credited_cents, always_cents=True)}
        return gettext("credited %(usd)s to your balance at $%(rate)s per %(coin)s when it confirmed") % {
            "usd": format_usd(p.credited_cents, always_cents=True), "rate": format(p.credit_rate.normalize(), "f"),
            "coin": quote.coin}
    if p.state == Payment.State.SEEN:
        return gettext("waiting for confirmations")
    if quote.state == Quote.State.SETTLED and p.credited_cents is None:
        return gettext("paid the invoice")
    return gettext("confirmed")


def time_left(deadline: datetime, now: datetime) -> str:
    """The same text static/js/countdown.js keeps fresh: "in 12 min", "in 1 h 5 min"."""
    seconds = int((deadline - now).total_seconds())
    s = abs(seconds)
    d, h, m = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if d:
        span = gettext("%(d)d d %(h)d h") % {"d": d, "h": h}
    elif h:
        span = gettext("%(h)d h %(m)d min") % {"h": h, "m": m}
    else:
        span = ngettext("%(n)d min", "%(n)d min", m) % {"n": m}
    return gettext("in %(span)s") % {"span": span} if seconds >= 0 else gettext("%(span)s ago") % {"span": span}


def qr_svg(uri: str) -> SafeString:
    """Inline SVG (no external image, CSP-safe); segno escapes nothing we render unescaped
    except its own markup, and the URI only appears encoded as modules."""
    svg = segno.make(uri, error="m").svg_inline(scale=4, border=2, dark="#111", light="#fff",
                                                 title=gettext("Payment QR code"))
    return mark_safe(svg)  # noqa: S308 - generated by segno from the URI, no user markup
