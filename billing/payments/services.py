"""Crypto payments: a quote per (invoice, coin), and what every payment the watchers report
does to the money — each payment credited exactly once.

A quote's payments are split three ways, and each base unit ends up in exactly one:

* **settlement** — payments first seen on time (before ``expires_at``) and confirmed when
  the quote settles; they pay the invoice once (``invoice_mark_paid``); what they exceed
  the amount by is credited to the balance once (``excess:<quote>``);
* **per-payment credits** — every other confirmed payment (late ones, ones arriving after
  settlement, the on-time part of a quote that expired partly paid) is credited to the
  balance on its own (``payment:<payment>``), at the quote's locked rate, rounded down;
* **nothing** — payments that left the chain (``reorged``) before they counted.

Writes lock the quote row first, so two watchers applying the same scan serialise there;
the (coin, txid, output_index) unique constraint and the ledger's idempotency keys make a
repeated scan (restart, second watcher) a no-op.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal, localcontext

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext

from inventory.services import SoldOut
from rental.lifecycle import BATCH, Transition

from ..models import (
    CoinRate,
    CoinWallet,
    Invoice,
    LatePaymentClaim,
    LedgerEntry,
    Payment,
    Quote,
    WatcherCursor,
)
from ..services import (
    BillingError,
    checkout_place_order,
    invoice_mark_paid,
    invoice_pay_from_balance,
    ledger_post,
)
from . import config as coins_config
from .coins.amounts import usd_cents_to_base_units
from .coins.base import Coin, DetectedPayment, ScanResult
from .coins.rates import Rate, is_stale
from .coins.utxo import gap_warning

log = logging.getLogger("billing.payments")

QS = Quote.State
QX = Quote.Exception_
PS = Payment.State
#: quotes still waiting for money (an invalid quote recovers if its payment reappears)
OPEN_QUOTE_STATES = (QS.NEW, QS.PROCESSING, QS.INVALID)


class PaymentError(BillingError):
    """A refused payment operation, with a message fit for the customer."""


# --- quotes -------------------------------------------------------------------------------

def coins_offered() -> list[Coin]:
    return sorted(coins_config.adapters(), key=list(Coin).index)


def rate_for(coin: Coin, now: datetime) -> Rate:
    """The operator's rate (CoinRate), else the peg for stablecoins; stale rates refused."""
    row = CoinRate.objects.filter(coin=coin).first()
    if row is not None:
        rate = Rate(coin, row.usd_per_coin, row.source, row.set_at)
    elif coin.spec.stablecoin:
        rate = Rate(coin, coins_config.stable_peg(coin), "peg", now)
    else:
        raise PaymentError(gettext("No %(coin)s exchange rate is set yet; please pay with another coin.") % {"coin": coin})
    if is_stale(rate, now, coins_config.rate_max_age()):
        raise PaymentError(gettext("The %(coin)s exchange rate (set %(at)s UTC) is out of date, so we cannot quote "
                                   "in %(coin)s right now; please pay with another coin or try again later.")
                           % {"coin": coin, "at": f"{rate.at:%Y-%m-%d %H:%M}"})
    return rate


@transaction.atomic
def quote_create(*, invoice: Invoice, coin: str, now: datetime) -> Quote:
    """A fresh receive address and the amount at a fresh locked rate, rounded up. An
    unpaid, unexpired quote for the same invoice and coin is returned instead of burning
    another address (gap limit)."""
    coin = _coin(coin)
    adapter = coins_config.adapter(coin)
    if adapter is None:
        raise PaymentError(gettext("%(coin)s is not accepted here.") % {"coin": coin})
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.state != Invoice.State.OPEN or (invoice.expires_at and invoice.expires_at <= now):
        raise PaymentError(gettext("Invoice #%(id)s is no longer open.") % {"id": invoice.pk})
    reusable = invoice.quotes.filter(coin=coin, state=QS.NEW, expires_at__gt=now).first()
    if reusable is not None:
        return reusable
    rate = rate_for(coin, now)
    amount = usd_cents_to_base_units(invoice.amount_cents, rate.usd_per_coin, coin=coin)
    address, index, reference = _receive_address(adapter, coin)
    window_end = now + coins_config.quote_window()
    return Quote.objects.create(
        invoice=invoice, coin=coin, address=address, derivation_index=index, reference=reference,
        amount=amount, usd_cents=invoice.amount_cents, rate_usd_per_coin=rate.usd_per_coin,
        rate_source=rate.source, rate_at=rate.at, created_at=now,
        uri=adapter.payment_uri(reference or address, amount, label=f"Invoice {invoice.pk}"),
        expires_at=min(invoice.expires_at, window_end) if invoice.expires_at else window_end,
    )


def _coin(coin: str) -> Coin:
    try:
        return Coin(str(coin).upper())
    except ValueError:
        raise PaymentError(gettext("Unknown coin %(coin)r.") % {"coin": coin}) from None


def _receive_address(adapter, coin: Coin) -> tuple[str, int | None, str]:
    """(address, derivation index, Solana Pay reference)."""
    if coin is Coin.XMR:
        address, index = adapter.create_address()
        return address, index, ""
    if coin is Coin.SOL:
        return adapter.merchant, None, adapter.address_for_index(0)
    wallet = CoinWallet.objects.get_or_create(coin=coins_config.wallet_coin(coin))[0]
    wallet = CoinWallet.objects.select_for_update().get(pk=wallet.pk)
    CoinWallet.objects.filter(pk=wallet.pk).update(next_index=F("next_index") + 1)
    wallet.next_index += 1
    if wallet_gap_exceeded(wallet):
        log.warning("%s: %d addresses issued past the last paid one (index %d): raise the wallet's gap limit "
                    "to see payments to them", wallet.coin, wallet.next_index - 1 - wallet.highest_paid_index,
                    wallet.highest_paid_index)
    return adapter.address_for_index(wallet.next_index - 1), wallet.next_index - 1, ""


def wallet_gap_exceeded(wallet: CoinWallet) -> bool:
    """Unpaid addresses run ``ADDRESS_GAP_LIMIT`` (20) or more past the last paid one: a
    wallet restored from the xpub with the default gap limit would not see the next payment."""
    issued = wallet.next_index - 1 if wallet.next_index else None
    return gap_warning(wallet.highest_paid_index, issued, coins_config.gap_limit())


# --- amounts ------------------------------------------------------------------------------

def to_usd_cents(base_units: int, quote: Quote) -> int:
    """Base units → USD cents at the quote's locked rate, rounded DOWN (never over-credit)."""
    with localcontext() as ctx:
        ctx.prec = 80
        cents = Decimal(base_units) * quote.rate_usd_per_coin * 100 / Decimal(10) ** Coin(quote.coin).decimals
        return int(cents.to_integral_value(rounding=ROUND_FLOOR))


def amount_due_min(quote: Quote) -> int:
    """The amount minus the underpayment tolerance (basis points, rounded in our favour)."""
    amount = int(quote.amount)
    return amount - amount * coins_config.tolerance_bps() // 10_000


# --- applying what the watchers found -----------------------------------------------------

@dataclass
class ApplyResult:
    quotes: list[int] = field(default_factory=list)
    unknown: list[DetectedPayment] = field(default_factory=list)


def payments_apply_scan(*, coin: str, scan: ScanResult, now: datetime) -> ApplyResult:
    """Record one watcher pass: upsert its payments, mark the reorged ones, and move each
    touched quote (one transaction per quote)."""
    coin = _coin(coin)
    adapter = coins_config.adapter(coin)
    required = adapter.required_confirmations if adapter else coin.spec.required_confirmations
    by_quote, unknown = _group_by_quote(coin, scan.payments)
    reorged = _reorged_by_quote(coin, scan.reorged)
    for quote_id in sorted(set(by_quote) | set(reorged)):
        _apply_to_quote(quote_id, by_quote.get(quote_id, []), reorged.get(quote_id, []), required, now)
    for p in unknown:
        log.warning("%s payment %s:%d to %s matches no quote", coin, p.txid, p.output_index, p.address)
    return ApplyResult(sorted(set(by_quote) | set(reorged)), unknown)


def _group_by_quote(coin: Coin, payments: list[DetectedPayment]):
    """address → quote with one query (a set lookup per payment)."""
    key = "reference" if coin is Coin.SOL else "address"
    addresses = {p.address for p in payments}
    ids = dict(Quote.objects.filter(coin=coin, **{f"{key}__in": addresses}).values_list(key, "pk")) if addresses else {}
    grouped: dict[int, list[DetectedPayment]] = defaultdict(list)
    unknown = []
    for p in payments:
        (grouped[ids[p.address]] if p.address in ids else unknown).append(p)
    return grouped, unknown


def _reorged_by_quote(coin: Coin, keys) -> dict[int, list[int]]:
    wanted = {(txid, int(n)) for txid, n in keys}
    if not wanted:
        return {}
    rows = Payment.objects.filter(coin=coin, txid__in={t for t, _ in wanted}).values_list(
        "pk", "quote_id", "txid", "output_index")
    out: dict[int, list[int]] = defaultdict(list)
    for pk, quote_id, txid, n in rows:
        if (txid, n) in wanted:
            out[quote_id].append(pk)
    return out


@transaction.atomic
def _apply_to_quote(quote_id: int, found: list[DetectedPayment], reorged_pks: list[int], required: int,
                    now: datetime) -> None:
    quote = Quote.objects.select_for_update(of=("self",)).select_related("invoice").get(pk=quote_id)
    for p in found:
        _payment_upsert(quote, p, required, now)
    if reorged_pks:
        gone = Payment.objects.filter(pk__in=reorged_pks).exclude(state=PS.REORGED).update(state=PS.REORGED)
        if gone and quote.state == QS.SETTLED:
            log.error("quote #%s: a payment left the chain after the quote settled", quote.pk)
    quote_refresh(quote, now)


def _payment_upsert(quote: Quote, p: DetectedPayment, required: int, now: datetime) -> Payment:
    confirmed = p.confirmations >= required
    chain = {"confirmations": p.confirmations, "block_hash": p.block_hash or "", "block_height": p.block_height}
    try:
        with transaction.atomic():
            row, created = Payment.objects.get_or_create(
                coin=p.coin, txid=p.txid, output_index=p.output_index,
                defaults={"quote": quote, "address": p.address, "amount": p.amount, "first_seen_at": now,
                          "state": PS.CONFIRMED if confirmed else PS.SEEN,
                          "confirmed_at": now if confirmed else None, **chain})
    except IntegrityError:  # another watcher inserted it between our read and write
        row, created = Payment.objects.get(coin=p.coin, txid=p.txid, output_index=p.output_index), False
    if created:
        _mark_index_paid(quote)
    else:
        _payment_update(row, confirmed, chain, now)
    return row


def _payment_update(row: Payment, confirmed: bool, chain: dict, now: datetime) -> None:
    """Confirmed is final (adapters stop reporting a payment once it has its confirmations);
    a payment reported again after a reorg counts again."""
    fields = dict(chain)
    if confirmed or row.state == PS.CONFIRMED:
        fields["state"] = PS.CONFIRMED
        fields["confirmed_at"] = row.confirmed_at or now
    else:
        fields["state"] = PS.SEEN
    Payment.objects.filter(pk=row.pk).update(**fields)


def _mark_index_paid(quote: Quote) -> None:
    if quote.derivation_index is None or quote.coin in (Coin.XMR, Coin.SOL):
        return
    CoinWallet.objects.filter(coin=coins_config.wallet_coin(quote.coin),
                              highest_paid_index__lt=quote.derivation_index).update(
        highest_paid_index=quote.derivation_index)


# --- the quote's state, from its payments ------------------------------------------------

def quote_refresh(quote: Quote, now: datetime) -> Quote:
    """Recompute received/confirmed from the quote's payments and move the quote. Call with
    the quote row locked (``_apply_to_quote``, ``sweep_expire_quotes``)."""
    live = list(quote.payments.exclude(state=PS.REORGED).order_by("first_seen_at", "pk"))
    seen_any = bool(live) or quote.payments.exists()
    quote.received = sum(int(p.amount) for p in live)
    quote.confirmed = sum(int(p.amount) for p in live if p.state == PS.CONFIRMED)
    Quote.objects.filter(pk=quote.pk).update(received=quote.received, confirmed=quote.confirmed)
    if quote.state in OPEN_QUOTE_STATES:
        _advance(quote, live, seen_any, now)
    if quote.state == QS.SETTLED:
        if _credit_unsettled(quote, live, now, LedgerEntry.Kind.EXCESS_PAYMENT) and quote.exception != QX.OVER:
            _set_state(quote, QS.SETTLED, QX.OVER)
    elif quote.state == QS.EXPIRED:
        late = any(p.first_seen_at > quote.expires_at for p in live)
        exception = QX.LATE if late else (QX.PARTIAL if live else quote.exception)
        if exception != quote.exception:
            _set_state(quote, QS.EXPIRED, exception)
        _credit_unsettled(quote, live, now, LedgerEntry.Kind.LATE_PAYMENT)
    return quote


def _advance(quote: Quote, live: list[Payment], seen_any: bool, now: datetime) -> None:
    on_time = [p for p in live if p.first_seen_at <= quote.expires_at]
    due = amount_due_min(quote)
    if sum(int(p.amount) for p in on_time if p.state == PS.CONFIRMED) >= due:
        return _settle(quote, [p for p in on_time if p.state == PS.CONFIRMED], now)
    seen = sum(int(p.amount) for p in on_time)
    if seen >= due:  # all there, waiting for confirmations: hold the order's slots meanwhile
        _hold_invoice(quote, on_time[-1].first_seen_at + coins_config.confirmation_hold())
        return _set_state(quote, QS.PROCESSING, QX.NONE)
    if on_time:
        _extend_partial(quote, on_time[-1].first_seen_at)
    if now >= quote.expires_at:
        late = any(p.first_seen_at > quote.expires_at for p in live)
        return _set_state(quote, QS.EXPIRED, QX.LATE if late else (QX.PARTIAL if on_time else QX.NONE))
    if on_time:
        return _set_state(quote, QS.PROCESSING, QX.PARTIAL)
    _set_state(quote, QS.INVALID if seen_any else QS.NEW, QX.NONE)


def _set_state(quote: Quote, state: str, exception: str | None) -> None:
    fields = {"state": state} if exception is None else {"state": state, "exception": exception}
    Quote.objects.filter(pk=quote.pk).update(**fields)
    for k, v in fields.items():
        setattr(quote, k, v)


def _extend_partial(quote: Quote, last_seen: datetime) -> None:
    """A partly paid quote stays open a window past its last payment, up to a bound."""
    bound = quote.created_at + coins_config.quote_window() + coins_config.partial_max_extension()
    until = min(max(quote.expires_at, last_seen + coins_config.quote_window()), bound)
    if until > quote.expires_at:
        Quote.objects.filter(pk=quote.pk).update(expires_at=until)
        quote.expires_at = until
        _hold_invoice(quote, until)


def _hold_invoice(quote: Quote, until: datetime) -> None:
    """Keep an open order's slots (its invoice's expiry) while its payment arrives."""
    Invoice.objects.filter(pk=quote.invoice_id, state=Invoice.State.OPEN, kind=Invoice.Kind.ORDER,
                           expires_at__lt=until).update(expires_at=until)


def _settle(quote: Quote, counted: list[Payment], now: datetime) -> None:
    """Settled once (guarded update); the invoice is paid once; the excess, or all of it
    when the invoice closed meanwhile, goes to the balance once."""
    if not Quote.objects.filter(pk=quote.pk, state__in=OPEN_QUOTE_STATES).update(
            state=QS.SETTLED, settled_at=now, exception=QX.NONE):
        return
    quote.state, quote.settled_at, quote.exception = QS.SETTLED, now, QX.NONE
    paid = sum(int(p.amount) for p in counted)
    invoice = quote.invoice
    if invoice_mark_paid(invoice=invoice, via=quote.coin, now=now, note=f"{quote.coin} quote #{quote.pk}"):
        if paid > int(quote.amount):
            _credit(quote, paid - int(quote.amount), now, LedgerEntry.Kind.EXCESS_PAYMENT, f"excess:{quote.pk}",
                    f"overpayment of {quote.coin} quote #{quote.pk}")
            _set_state(quote, QS.SETTLED, QX.OVER)
        return
    invoice.refresh_from_db()
    closed_by_payment = invoice.state == Invoice.State.PAID
    kind = LedgerEntry.Kind.EXCESS_PAYMENT if closed_by_payment else LedgerEntry.Kind.LATE_PAYMENT
    _credit(quote, paid, now, kind, f"excess:{quote.pk}",
            f"{quote.coin} quote #{quote.pk}: invoice #{invoice.pk} was already {invoice.get_state_display()}")
    _set_state(quote, QS.SETTLED, QX.OVER if closed_by_payment else QX.LATE)


def _credit_unsettled(quote: Quote, live: list[Payment], now: datetime, kind: str) -> bool:
    """Every confirmed payment that did not count towards a settlement: credited on its own
    (once: keyed by the payment). True when there is any."""
    extra = [p for p in live if p.state == PS.CONFIRMED and not _counted_in_settlement(quote, p)]
    for p in extra:
        _credit(quote, int(p.amount), now, kind, f"payment:{p.pk}",
                f"{quote.coin} {p.txid[:16]}…:{p.output_index} to quote #{quote.pk} ({quote.get_state_display()})")
    return bool(extra)


def _counted_in_settlement(quote: Quote, p: Payment) -> bool:
    return (quote.state == QS.SETTLED and p.first_seen_at <= quote.expires_at
            and p.confirmed_at is not None and p.confirmed_at <= quote.settled_at)


def _credit(quote: Quote, base_units: int, now: datetime, kind: str, key: str, memo: str) -> None:
    cents = to_usd_cents(base_units, quote)
    if cents <= 0:
        log.info("quote #%s: %s base units are worth less than a cent; not credited", quote.pk, base_units)
        return
    ledger_post(customer=quote.invoice.customer, kind=kind, amount_cents=cents, now=now, invoice=quote.invoice,
                memo=memo, idempotency_key=key)


# --- expiry sweep and the watcher ---------------------------------------------------------

def sweep_expire_quotes(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Quotes past their expiry that are not fully paid on time → expired (the on-time part
    of a partly paid one goes to the balance once confirmed). For billing.lifecycle.SWEEPS."""
    due = Quote.objects.filter(state__in=OPEN_QUOTE_STATES, expires_at__lte=now).order_by("expires_at")
    done = []
    for quote_id, lease_id in due.values_list("pk", "invoice__lease_id")[:limit]:
        if _expire_one(quote_id, now):
            done.append(Transition(lease_id, f"quote #{quote_id} expired"))
    return done


@transaction.atomic
def _expire_one(quote_id: int, now: datetime) -> bool:
    quote = Quote.objects.select_for_update(of=("self",)).select_related("invoice").get(pk=quote_id)
    if quote.state not in OPEN_QUOTE_STATES:
        return False
    return quote_refresh(quote, now).state == QS.EXPIRED


def watch_set(coin: Coin, now: datetime):
    """What the watcher looks for: open quotes, plus quotes closed within LATE_PAYMENT_WATCH_DAYS
    (late payments and overpayments are still credited)."""
    recent = now - coins_config.late_watch()
    quotes = Quote.objects.filter(coin=coin).filter(Q(state__in=OPEN_QUOTE_STATES) | Q(expires_at__gte=recent)
                                                    | Q(settled_at__gte=recent))
    if coin is Coin.SOL:
        return set(quotes.values_list("reference", flat=True))
    if coin is Coin.XMR:
        return dict(quotes.values_list("address", "derivation_index"))
    return set(quotes.values_list("address", flat=True))


def watch_coin(*, coin: str, now: datetime | None = None) -> ApplyResult:
    """One watcher pass: cursor → scan → apply → save cursor, in that order, so a crash
    before the save only makes the next pass report the same payments again (absorbed)."""
    coin = _coin(coin)
    adapter = coins_config.adapter(coin)
    if adapter is None:
        raise PaymentError(gettext("%(coin)s is not configured.") % {"coin": coin})
    now = now or timezone.now()
    cursor = WatcherCursor.objects.get_or_create(coin=coin)[0]
    result = adapter.scan(watch_set(coin, now), dict(cursor.cursor))
    applied = payments_apply_scan(coin=coin, scan=result, now=now)
    WatcherCursor.objects.filter(pk=cursor.pk).update(cursor=result.cursor, updated_at=now)
    return applied


# --- late payments: the customer may still buy the order ---------------------------------

@transaction.atomic
def late_payment_confirm(*, quote: Quote, customer, now: datetime | None = None) -> Invoice:
    """Use a late payment (already on the balance) for what it was meant to buy: the invoice
    if still open, else the same order again if the slots are free. Sold out → PaymentError,
    the money stays on the balance. Once per quote."""
    now = now or timezone.now()
    quote = Quote.objects.select_for_update(of=("self",)).select_related("invoice__lease").get(pk=quote.pk)
    invoice = quote.invoice
    if invoice.customer_id != customer.pk:
        raise PaymentError(gettext("This quote is not yours."))
    if not late_payment_claimable(quote):
        raise PaymentError(gettext("This quote has no late payment to use."))
    if invoice.state == Invoice.State.OPEN:
        target = invoice_pay_from_balance(invoice=invoice, now=now, actor=customer)
    elif invoice.kind == Invoice.Kind.ORDER and invoice.lease_id:
        target = _reorder(invoice, customer, now)
    else:
        raise PaymentError(gettext("Invoice #%(id)s is %(state)s; the payment stays on your balance.")
                           % {"id": invoice.pk, "state": invoice.get_state_display()})
    LatePaymentClaim.objects.create(quote=quote, invoice=target, at=now)
    return target


def late_payment_claimable(quote: Quote) -> bool:
    return (quote.state in (QS.EXPIRED, QS.SETTLED) and quote.exception in (QX.LATE, QX.PARTIAL)
            and int(quote.confirmed) > 0 and quote.invoice.state != Invoice.State.PAID
            and not LatePaymentClaim.objects.filter(quote=quote).exists())


def _reorder(invoice: Invoice, customer, now: datetime) -> Invoice:
    lease = invoice.lease
    addons = {f: getattr(lease, f) for f in ("extra_nvme_tb", "network_volume_tb", "snapshot_tb")}
    try:
        _, new_invoice = checkout_place_order(
            customer=customer, offer=lease.offer, site=lease.site, term=lease.term, image=lease.image,
            ssh_public_key=lease.ssh_public_key, addons={k: v for k, v in addons.items() if v},
            pay_from_balance=True, now=now)
    except SoldOut:
        raise PaymentError(gettext("That GPU is sold out now; your payment stays on your balance.")) from None
    return new_invoice


# --- operator rates -------------------------------------------------------------------------

@transaction.atomic
def coin_rate_set(*, coin: str, usd_per_coin: Decimal, actor, now: datetime, source: str = "operator") -> CoinRate:
    """An operator sets a coin's rate (USD per whole coin); dated now, audited."""
    from inventory.services import audit_record

    coin = _coin(coin)
    if isinstance(usd_per_coin, float) or Decimal(usd_per_coin) <= 0:
        raise PaymentError(gettext("A rate is a positive decimal number of USD per coin."))
    rate, _ = CoinRate.objects.update_or_create(coin=coin, defaults={
        "usd_per_coin": Decimal(usd_per_coin), "source": source or "operator", "set_at": now})
    audit_record(actor=actor, action="coin_rate_set", obj=rate,
                 detail={"coin": str(coin), "usd_per_coin": str(usd_per_coin), "source": rate.source})
    return rate
