"""Quotes: the coins a customer may pay with, a quote per (invoice, coin) — a fresh receive
address and the amount at a locked rate — and the amounts a quote's payments are judged by
(USD at the locked rate, confirmations needed, dust, the tolerance). What the payments then
do to the money is billing.payments.services."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext

from ..models import Invoice, Payment, Quote
from . import config as coins_config
from .addresses import receive_address, unpaid_addresses_full
from .coins.amounts import usd_cents_to_base_units
from .coins.base import Coin
from .health import coin_health
from .pricing import PaymentError, cents_at, rate_for

QS = Quote.State


# --- quotes -------------------------------------------------------------------------------

def coins_watched() -> list[Coin]:
    """Every configured coin (the watchers keep scanning a coin whose node is unwell)."""
    return sorted(coins_config.adapters(), key=list(Coin).index)


def coins_offered(now: datetime | None = None, *, customer=None) -> list[Coin]:
    """The coins a customer may pay with now: configured, their node healthy, and (for a
    given customer) able to give them a new address — a coin that cannot take their quote
    is not offered to them."""
    now = now or timezone.now()
    return [c for c in coins_watched() if coin_health(c, now) is None
            and not (customer is not None and unpaid_addresses_full(c, customer.pk))]


def quote_create(*, invoice: Invoice, coin: str, now: datetime) -> Quote:
    """A fresh receive address and the amount at a fresh locked rate, rounded up. An
    unpaid, unexpired quote for the same invoice and coin is returned instead of burning
    another address (gap limit)."""
    with transaction.atomic():
        coin = _coin(coin)
        adapter = coins_config.adapter(coin)
        if adapter is None:
            raise PaymentError(gettext("%(coin)s is not accepted here.") % {"coin": coin})
        if coin_health(coin, now) is not None:
            raise PaymentError(gettext("We cannot watch the %(coin)s network right now, so we do not take %(coin)s "
                                       "payments; please pay with another coin or try again later.") % {"coin": coin})
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if invoice.state != Invoice.State.OPEN or (invoice.expires_at and invoice.expires_at <= now):
            raise PaymentError(gettext("Invoice #%(id)s is no longer open.") % {"id": invoice.pk})
        reusable = invoice.quotes.filter(coin=coin, state=QS.NEW, expires_at__gt=now).first()
        if reusable is not None:
            return reusable
        _check_quote_rate_limit(invoice.customer_id, now)
        rate = rate_for(coin, now)
        amount = usd_cents_to_base_units(invoice.amount_cents, rate.usd_per_coin, coin=coin)
        address, index, reference = receive_address(adapter, coin, customer_id=invoice.customer_id)
        quote = Quote.objects.create(
            invoice=invoice, coin=coin, address=address, derivation_index=index, reference=reference,
            amount=amount, usd_cents=invoice.amount_cents, rate_usd_per_coin=rate.usd_per_coin,
            rate_source=rate.source, rate_at=rate.at, created_at=now,
            uri=adapter.payment_uri(reference or address, amount, label=f"Invoice {invoice.pk}"),
            expires_at=_quote_expiry(invoice, now),
        )
        _hold_invoice(quote, quote.expires_at)
        return quote


def _quote_expiry(invoice: Invoice, now: datetime) -> datetime:
    """A full window, within the order's; but never less than the minimum window, so a quote
    taken at the end of an order's window can still be paid (the slots are held that
    much longer, once: bounded from the invoice's creation)."""
    window_end = now + coins_config.quote_window()
    if not invoice.expires_at:
        return window_end
    floor = min(now + coins_config.quote_min_window(),
                invoice.created_at + coins_config.quote_window() + coins_config.quote_min_window())
    return max(min(invoice.expires_at, window_end), floor)


def _check_quote_rate_limit(customer_id: int, now: datetime) -> None:
    recent = Quote.objects.filter(invoice__customer_id=customer_id, created_at__gt=now - timedelta(hours=1)).count()
    if recent >= coins_config.quotes_per_hour():
        raise PaymentError(gettext("You asked for many payment addresses in the last hour; please pay one of your "
                                   "open quotes, or try again later."))


def _coin(coin: str) -> Coin:
    try:
        return Coin(str(coin).upper())
    except ValueError:
        raise PaymentError(gettext("Unknown coin %(coin)r.") % {"coin": coin}) from None


# --- amounts ------------------------------------------------------------------------------

def to_usd_cents(base_units: int, quote: Quote) -> int:
    """Base units → USD cents at the quote's locked rate, rounded DOWN (never over-credit)."""
    return cents_at(base_units, quote.rate_usd_per_coin, quote.coin)


def required_confirmations(quote: Quote, coin_required: int) -> int:
    """Speed policy: a small quote needs fewer confirmations, never more than the coin's."""
    for below_cents, confirmations in coins_config.speed_policy():
        if int(quote.usd_cents) < below_cents:
            return max(1, min(confirmations, coin_required))
    return coin_required


def is_dust(quote: Quote, payment: Payment) -> bool:
    return int(payment.amount) * 10_000 < int(quote.amount) * coins_config.dust_bps()


def amount_due_min(quote: Quote) -> int:
    """The amount minus the underpayment tolerance (basis points, rounded in our favour)."""
    amount = int(quote.amount)
    return amount - amount * coins_config.tolerance_bps() // 10_000


def _hold_invoice(quote: Quote, until: datetime) -> None:
    """Keep an open order's slots (its invoice's expiry) while its payment arrives."""
    Invoice.objects.filter(pk=quote.invoice_id, state=Invoice.State.OPEN, kind=Invoice.Kind.ORDER,
                           expires_at__lt=until).update(expires_at=until)
