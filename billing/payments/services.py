"""Crypto payments: a quote per (invoice, coin), and what every payment the watchers report
does to the money — each payment credited exactly once.

A quote's payments are split three ways, and each base unit ends up in exactly one:

* **settlement** — payments first seen on time (before ``expires_at``) and confirmed when
  the quote settles; they pay the invoice once (``invoice_mark_paid``); what they exceed
  the amount by is credited to the balance once (``excess:<quote>``);
* **per-payment credits** — every other confirmed payment (late ones, ones arriving after
  settlement, the on-time part of a quote that expired partly paid) is credited to the
  balance on its own (``payment:<payment>``), rounded down: at the locked rate if it was
  sent while the rate was locked, else at the rate when it confirmed, up to the quote's
  automatic cap — the rest waits for an operator (``credits``);
* **nothing** — payments that left the chain (``reorged``) or the mempool unmined
  (``invalid``: double-spent, replaced, evicted, or unconfirmed past the monitoring
  window) before they counted. One that leaves after it counted is reversed (``credits``).

Times are the chain's (mempool entry / block time), so a watcher's downtime does not make
an on-time payment late — but never before the last watcher pass that caught up with the
chain without the payment, so a miner's back-dated block does not make a late one on time.

Writes lock the quote row first, so two watchers applying the same scan serialise there;
the (coin, txid, output_index) unique constraint and the ledger's idempotency keys make a
repeated scan (restart, second watcher) a no-op.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.translation import gettext

from rental.lifecycle import BATCH, Transition

from ..models import (
    CoinWallet,
    Invoice,
    LedgerEntry,
    Payment,
    Quote,
    WatcherCursor,
)
from ..services import (
    invoice_mark_paid,
)
from . import config as coins_config
from .addresses import receive_address, unpaid_addresses_full, wallet_gap_exceeded  # noqa: F401 - re-exported
from .coins.base import Coin, DetectedPayment, ScanResult
from .credits import (
    credit_extra_payment,
    credit_or_hold,
    held_reviews_follow_chain,
    payment_on_time,
)
from .health import awaiting_watchers, coin_health_record
from .misdirected import misdirected_gone, misdirected_report
from .pricing import PaymentError
from .quotes import (  # noqa: F401 - re-exported: the quote's side, for the pages and the watchers
    _coin,
    _hold_invoice,
    amount_due_min,
    coins_offered,
    coins_watched,
    is_dust,
    quote_create,
    required_confirmations,
    to_usd_cents,
)
from .reversals import debt_settle, quote_reconcile, settled_note, settlement_units

log = logging.getLogger("billing.payments")

QS = Quote.State
QX = Quote.Exception_
PS = Payment.State
#: quotes still waiting for money (an invalid quote recovers if its payment reappears)
OPEN_QUOTE_STATES = (QS.NEW, QS.PROCESSING, QS.INVALID)
#: an unconfirmed payment past the monitoring window; it counts again only once mined
TIMED_OUT = "unconfirmed_too_long"
#: the audit action of a deposit of a token that is not configured
WRONG_TOKEN = "wrong_token_deposit"


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
    reorged = _reorged_by_quote(coin, [(t, n, "reorged") for t, n in scan.reorged])
    dropped = _reorged_by_quote(coin, scan.dropped)
    touched = sorted(set(by_quote) | set(reorged) | set(dropped))
    # the last pass that caught up with the chain (this pass's cursor is saved after it) did
    # not see the payments this one finds new: they reached the chain after it
    seen_after = WatcherCursor.objects.filter(coin=coin).values_list("scanned_to", flat=True).first()
    for quote_id in touched:
        _apply_to_quote(quote_id, by_quote.get(quote_id, []), reorged.get(quote_id, []), dropped.get(quote_id, []),
                        required, now, seen_after)
    if scan.reorged:  # a misdirected transfer that left the chain: its review cannot be credited
        misdirected_gone(coin=coin, keys=scan.reorged, now=now)
    for p in unknown:
        if not misdirected_report(coin=coin, payment=p, required=required, now=now):
            log.warning("%s payment %s:%d to %s matches no quote", coin, p.txid, p.output_index, p.address)
    for deposit in scan.foreign:
        _report_wrong_token(coin, deposit)
    return ApplyResult(touched, unknown)


def _report_wrong_token(coin: Coin, deposit: dict) -> None:
    """A token we do not take, sent to a quote's address: the operators see it on the
    dashboard (it cannot be credited; the customer may ask for it back). Once per log."""
    from inventory.audit import audit_record
    from inventory.models import AuditEntry

    quote = Quote.objects.filter(coin__in=(Coin.ETH, Coin.USDT, Coin.USDC), address__iexact=deposit["to"]).first()
    if quote is None or AuditEntry.objects.filter(action=WRONG_TOKEN, object_id=str(quote.pk),
                                                  detail__txid=deposit["txid"],
                                                  detail__log_index=deposit["log_index"]).exists():
        return
    log.warning("%s: token %s sent to quote #%s (%s); not credited", coin, deposit["token"], quote.pk, deposit["txid"])
    audit_record(actor=None, action=WRONG_TOKEN, obj=quote, detail=deposit)


def _group_by_quote(coin: Coin, payments: list[DetectedPayment]):
    """address → quote with one query (a set lookup per payment)."""
    key = "reference" if coin is Coin.SOL else "address"
    addresses = {p.address for p in payments}
    ids = dict(Quote.objects.filter(coin=coin, **{f"{key}__in": addresses}).values_list(key, "pk")) if addresses else {}
    grouped: dict[int, list[DetectedPayment]] = defaultdict(list)
    unknown: list[DetectedPayment] = []
    for p in payments:
        (grouped[ids[p.address]] if p.address in ids else unknown).append(p)
    return grouped, unknown


def _reorged_by_quote(coin: Coin, keys) -> dict[int, list[tuple[int, str]]]:
    """(txid, n, reason) → {quote: [(payment pk, reason)]}."""
    wanted = {(txid, int(n)): reason for txid, n, reason in keys}
    if not wanted:
        return {}
    rows = Payment.objects.filter(coin=coin, txid__in={t for t, _ in wanted}).values_list(
        "pk", "quote_id", "txid", "output_index")
    out: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for pk, quote_id, txid, n in rows:
        if (txid, n) in wanted:
            out[quote_id].append((pk, wanted[txid, n]))
    return out


def _apply_to_quote(quote_id: int, found: list[DetectedPayment], reorged: list[tuple[int, str]],
                    dropped: list[tuple[int, str]], coin_required: int, now: datetime,
                    seen_after: datetime | None = None) -> None:
    with transaction.atomic():
        quote = Quote.objects.select_for_update(of=("self",)).select_related("invoice").get(pk=quote_id)
        required = required_confirmations(quote, coin_required)
        for p in found:
            _payment_upsert(quote, p, required, now, seen_after)
        gone = {pk: (PS.REORGED, reason) for pk, reason in reorged}
        gone.update({pk: (PS.INVALID, reason) for pk, reason in dropped if pk not in gone})
        for row in Payment.objects.filter(pk__in=gone).exclude(state__in=(PS.REORGED, PS.INVALID)).order_by("pk"):
            # A payment left the chain (reorg) or the mempool unmined; if it had counted, the
            # quote's reconcile (quote_refresh → reversals) takes back what it paid or credited.
            Payment.objects.filter(pk=row.pk).update(state=gone[row.pk][0], invalid_reason=gone[row.pk][1])
        quote_refresh(quote, now)
        debt_settle(customer_id=quote.invoice.customer_id, now=now)


def _chain_time(p: DetectedPayment, now: datetime, seen_after: datetime | None = None) -> datetime:
    """When the chain first showed the payment; never in the future (block times may run
    ahead of ours), the watcher's clock when the chain does not say — and never before the
    last watcher pass that caught up with the chain without it (``seen_after``): a miner
    sets its block's time, and a block dated before a quote's expiry but first seen after
    it is late. Only while the watcher was down does the chain's date stand alone."""
    seen = now if p.chain_time is None else datetime.fromtimestamp(p.chain_time, tz=UTC)
    if seen_after is not None:  # to the chain's resolution (whole seconds): no later than the chain says
        seen = max(seen, seen_after.replace(microsecond=0))
    return min(seen, now)


def _payment_upsert(quote: Quote, p: DetectedPayment, required: int, now: datetime,
                    seen_after: datetime | None = None) -> Payment:
    confirmed = p.confirmations >= required
    chain = {"confirmations": p.confirmations, "block_hash": p.block_hash or "", "block_height": p.block_height}
    # Two watchers can both miss the row only for two quotes (each holds its own quote's
    # lock): one Solana transfer carrying two quotes' references. The unique constraint then
    # refuses the second insert, and get_or_create reads the winner's row instead (its own
    # IntegrityError handling, in a savepoint): the payment counts for one quote, once.
    row, created = Payment.objects.get_or_create(
        coin=p.coin, txid=p.txid, output_index=p.output_index,
        defaults={"quote": quote, "address": p.address, "amount": p.amount,
                  "first_seen_at": _chain_time(p, now, seen_after),
                  "state": PS.CONFIRMED if confirmed else PS.SEEN,
                  "confirmed_at": now if confirmed else None, **chain})
    if created:
        _mark_index_paid(quote)
    else:
        _payment_update(row, confirmed, chain, now)
    return row


def _payment_update(row: Payment, confirmed: bool, chain: dict, now: datetime) -> None:
    """Confirmed is final (adapters stop reporting a payment once it has its confirmations);
    a payment reported again after a reorg or a drop counts again — except one that sat
    unconfirmed past the monitoring window, until it is mined."""
    fields = dict(chain)
    if confirmed or row.state == PS.CONFIRMED:
        fields.update(state=PS.CONFIRMED, confirmed_at=row.confirmed_at or now, invalid_reason="")
    elif row.state == PS.INVALID and row.invalid_reason == TIMED_OUT and not chain["confirmations"]:
        pass
    else:
        fields.update(state=PS.SEEN, invalid_reason="")
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
    quote.payments.filter(state=PS.SEEN, confirmations=0,
                          first_seen_at__lte=now - coins_config.monitoring_window()).update(
        state=PS.INVALID, invalid_reason=TIMED_OUT)
    live = list(quote.payments.exclude(state__in=(PS.REORGED, PS.INVALID)).order_by("first_seen_at", "pk"))
    seen_any = bool(live) or quote.payments.exists()
    held_reviews_follow_chain(quote, now)
    quote.received = sum(int(p.amount) for p in live)
    quote.confirmed = sum(int(p.amount) for p in live if p.state == PS.CONFIRMED)
    Quote.objects.filter(pk=quote.pk).update(received=quote.received, confirmed=quote.confirmed)
    if quote.state in OPEN_QUOTE_STATES:
        _advance(quote, live, seen_any, now)
    if quote.state != QS.PROCESSING or quote.exception == QX.PARTIAL:
        # a quote back to a part paid (a part double-spent, evicted or reorged out) holds the
        # order only until its extended expiry, no longer the whole amount's monitoring window
        _release_hold(quote, now)
    if quote.state == QS.SETTLED:
        if _credit_unsettled(quote, live, now, LedgerEntry.Kind.EXCESS_PAYMENT) and quote.exception != QX.OVER:
            _set_state(quote, QS.SETTLED, QX.OVER)
    elif quote.state == QS.EXPIRED:
        exception = _expired_exception(quote, live) or quote.exception
        if exception != quote.exception:
            _set_state(quote, QS.EXPIRED, exception)
        _credit_unsettled(quote, live, now, LedgerEntry.Kind.LATE_PAYMENT)
    if quote.state in (QS.SETTLED, QS.EXPIRED):
        quote_reconcile(quote, now)
    return quote


def _expired_exception(quote: Quote, live: list[Payment]) -> str:
    """The one late/partial test of an expired quote: late when any payment came after the
    expiry (chain time), partial when only on-time ones did, none without payments."""
    if any(not payment_on_time(quote, p) for p in live):
        return QX.LATE
    return QX.PARTIAL if live else QX.NONE


def _advance(quote: Quote, live: list[Payment], seen_any: bool, now: datetime) -> None:
    on_time = [p for p in live if payment_on_time(quote, p)]
    due = amount_due_min(quote)
    if sum(int(p.amount) for p in on_time if p.state == PS.CONFIRMED) >= due:
        return _settle(quote, [p for p in on_time if p.state == PS.CONFIRMED], now)
    if sum(int(p.amount) for p in on_time) >= due:
        # all there, waiting for confirmations: the order's slots are held for the monitoring
        # window from the payment that completed the amount — later payments (dust, or ones
        # that never confirm) do not extend it again
        _hold_invoice(quote, _completed_by(on_time, due).first_seen_at + coins_config.monitoring_window())
        return _set_state(quote, QS.PROCESSING, QX.NONE)
    substantial = [p for p in on_time if not is_dust(quote, p)]
    if substantial:  # dust never extends the window; the first substantial payment does, once
        _extend_partial(quote, substantial[0].first_seen_at)
    if now >= quote.expires_at:
        return _set_state(quote, QS.EXPIRED, _expired_exception(quote, live))
    if on_time:
        return _set_state(quote, QS.PROCESSING, QX.PARTIAL)
    _set_state(quote, QS.INVALID if seen_any else QS.NEW, QX.NONE)


def _completed_by(payments: list[Payment], due: int) -> Payment:
    """The payment (in chain order) with which the amount due was first reached."""
    total = 0
    for p in payments:
        total += int(p.amount)
        if total >= due:
            return p
    return payments[-1]


def _set_state(quote: Quote, state: str, exception: str | None) -> None:
    fields = {"state": state} if exception is None else {"state": state, "exception": exception}
    Quote.objects.filter(pk=quote.pk).update(**fields)
    for k, v in fields.items():
        setattr(quote, k, v)


def _extend_partial(quote: Quote, last_seen: datetime) -> None:
    """A partly paid quote stays open a window past its last payment, up to a bound, and
    the order's slots are held as long. The hold is renewed even when the quote's expiry
    does not move: another quote of the order may have released it meanwhile (this
    payment left the mempool, then came back mined)."""
    bound = quote.created_at + coins_config.quote_window() + coins_config.partial_max_extension()
    until = min(max(quote.expires_at, last_seen + coins_config.quote_window()), bound)
    if until > quote.expires_at:
        Quote.objects.filter(pk=quote.pk).update(expires_at=until)
        quote.expires_at = until
    _hold_invoice(quote, until)


def _release_hold(quote: Quote, now: datetime) -> None:
    """No payment of this quote is confirming the whole amount any more (invalid, expired,
    settled, or only a part paid, which holds until the quote's extended expiry): the
    order's slots are held no longer than its own window, the quote's, the deadline another
    unpaid quote of the order was given (a quote taken late gets the minimum time to pay,
    `_hold_invoice`), or now — unless another quote of the same invoice is confirming."""
    others = Quote.objects.filter(invoice_id=quote.invoice_id).exclude(pk=quote.pk)
    if quote.invoice.kind != Invoice.Kind.ORDER or others.filter(state=QS.PROCESSING).exists():
        return
    promised = others.filter(state=QS.NEW).aggregate(latest=Max("expires_at"))["latest"]
    floor = max(quote.expires_at, _order_window_end(quote.invoice), now, promised or now)
    Invoice.objects.filter(pk=quote.invoice_id, state=Invoice.State.OPEN, expires_at__gt=floor).update(
        expires_at=floor)


def _order_window_end(invoice: Invoice) -> datetime:
    """The end of the order's own payment window (the account's: shorter for a new one),
    which a released hold falls back to."""
    pay_by = invoice.lease.pay_by if invoice.lease_id and invoice.lease else None
    return pay_by or invoice.created_at + coins_config.quote_window()


def _settle(quote: Quote, counted: list[Payment], now: datetime) -> None:
    """Settled once (guarded update); the invoice is paid once; the excess, or all of it
    when the invoice closed meanwhile, goes to the balance once."""
    if not Quote.objects.filter(pk=quote.pk, state__in=OPEN_QUOTE_STATES).update(
            state=QS.SETTLED, settled_at=now, exception=QX.NONE):
        return
    quote.state, quote.settled_at, quote.exception = QS.SETTLED, now, QX.NONE
    Payment.objects.filter(pk__in=[p.pk for p in counted]).update(in_settlement=True)
    for p in counted:
        p.in_settlement = True
    paid = sum(int(p.amount) for p in counted)
    invoice = quote.invoice
    if invoice_mark_paid(invoice=invoice, via=quote.coin, now=now, note=settled_note(quote)):
        if paid > int(quote.amount):
            _credit_settlement(quote, paid - int(quote.amount), now, LedgerEntry.Kind.EXCESS_PAYMENT,
                               f"overpayment of {quote.coin} quote #{quote.pk}")
            _set_state(quote, QS.SETTLED, QX.OVER)
        return
    invoice.refresh_from_db()
    closed_by_payment = invoice.state == Invoice.State.PAID
    kind = LedgerEntry.Kind.EXCESS_PAYMENT if closed_by_payment else LedgerEntry.Kind.LATE_PAYMENT
    _credit_settlement(quote, paid, now, kind,
                       f"{quote.coin} quote #{quote.pk}: invoice #{invoice.pk} was already {invoice.get_state_display()}")
    _set_state(quote, QS.SETTLED, QX.OVER if closed_by_payment else QX.LATE)


def _credit_settlement(quote: Quote, base_units: int, now: datetime, kind: str, memo: str) -> None:
    """What the on-time payments paid beyond the invoice: at the locked rate (they were sent
    under it), once (``excess:<quote>``), within the quote's automatic cap."""
    credit_or_hold(quote, to_usd_cents(base_units, quote), now, kind=kind, key=f"excess:{quote.pk}", memo=memo,
                   payment=None, amount=base_units)


def _credit_unsettled(quote: Quote, live: list[Payment], now: datetime, kind: str) -> bool:
    """Every confirmed payment that did not count towards a settlement: credited on its own
    (once: keyed by the payment) or held for an operator (``credits``). True when any.
    A settled quote whose settlement lost a payment (reorged, double-spent) takes the next
    confirmed ones into the settlement first, until it is covered again — a fee bump of
    the reversed payment (same outputs, new txid) pays the invoice, it is no extra credit."""
    extra = [p for p in live if p.state == PS.CONFIRMED and not p.in_settlement and p.credited_cents is None
             and not p.reviews.exists()]
    if quote.state == QS.SETTLED and any(p.in_settlement for p in quote.payments.all()):
        while extra and settlement_units(live) < amount_due_min(quote):
            p = extra.pop(0)
            Payment.objects.filter(pk=p.pk).update(in_settlement=True)
            p.in_settlement = True
    for p in extra:
        credit_extra_payment(quote, p, now, kind)
    return bool(extra)



# --- expiry sweep and the watcher ---------------------------------------------------------

def sweep_expire_quotes(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Quotes past their expiry that are not fully paid on time → expired (the on-time part
    of a partly paid one goes to the balance once confirmed). For ops.lifecycle.SWEEPS."""
    due = (Quote.objects.filter(state__in=OPEN_QUOTE_STATES, expires_at__lte=now)
           .exclude(awaiting_watchers(now, coin_field="coin", deadline_field="expires_at")).order_by("expires_at", "pk"))
    done = []
    for quote_id, lease_id in due.values_list("pk", "invoice__lease_id")[:limit]:
        if _expire_one(quote_id, now):
            done.append(Transition(lease_id, f"quote #{quote_id} expired"))
    return done


def _expire_one(quote_id: int, now: datetime) -> bool:
    with transaction.atomic():
        quote = Quote.objects.select_for_update(of=("self",)).select_related("invoice").get(pk=quote_id)
        if quote.state not in OPEN_QUOTE_STATES:
            return False
        return quote_refresh(quote, now).state == QS.EXPIRED


#: coins whose watcher matches addresses by a set lookup per output or log (or asks the wallet
#: once per pass): they look for every address the store ever gave, so a payment after the
#: late-payment window is recorded (and waits for an operator, ``credits``). ETH's per-address
#: work (the balance checks that find ETH sent by contracts) is done for the quotes of the
#: window only. Solana does a call per reference each pass for the window, and finds the
#: later payments to older references among the merchant address's new transfers.
WATCH_EVERY_ADDRESS = (Coin.BTC, Coin.LTC, Coin.XMR, Coin.ETH, Coin.USDT, Coin.USDC, Coin.SOL)
EVM = (Coin.ETH, Coin.USDT, Coin.USDC)


def watch_set(coin: Coin, now: datetime):
    """What the watcher looks for: open quotes, plus quotes closed within LATE_PAYMENT_WATCH_DAYS
    (late payments and overpayments are still credited) — every quote for WATCH_EVERY_ADDRESS.
    EVM: address → whether it is within the window (``EvmAdapter`` checks balances for those);
    SOL: reference → whether it is within the window (``SolanaAdapter`` asks for those)."""
    recent = now - coins_config.late_watch()
    in_window = Q(state__in=OPEN_QUOTE_STATES) | Q(expires_at__gte=recent) | Q(settled_at__gte=recent)
    # every quote address of the wallet: money in the wrong coin is reported (``misdirected``)
    coins = coins_config.wallet_coins(coin)
    quotes = Quote.objects.filter(coin__in=coins)
    if coin not in WATCH_EVERY_ADDRESS:
        quotes = quotes.filter(in_window)
    if coin is Coin.SOL:
        window = set(quotes.filter(in_window).values_list("reference", flat=True))
        return {r: r in window for r in quotes.values_list("reference", flat=True)}
    if coin is Coin.XMR:
        return dict(quotes.values_list("address", "derivation_index"))
    if coin in EVM:
        window = set(quotes.filter(in_window).values_list("address", flat=True))
        return {a: a in window for a in quotes.values_list("address", flat=True)}
    return set(quotes.values_list("address", flat=True))


def _gone_from_rewalked(coin: Coin, result: ScanResult, watch) -> set[tuple[str, int]]:
    """A reorg deeper than the walker's memory: the payments recorded in the blocks walked
    again (``ScanResult.rewalked``) that this walk did not find again have left the chain."""
    assert result.rewalked is not None  # called only when the walk rewalked (scan_result_apply)
    after, up_to = result.rewalked
    found = {p.key for p in result.payments}
    rows = (Payment.objects.filter(coin=coin, block_height__gt=after, block_height__lte=up_to)
            .exclude(state__in=(PS.REORGED, PS.INVALID)).values_list("txid", "output_index", "address"))
    return {(txid, n) for txid, n, address in rows if address in watch and (txid, n) not in found}


def watch_coin(*, coin: str, now: datetime | None = None) -> ApplyResult:
    """One watcher pass: cursor → scan → apply → save cursor, in that order, so a crash
    before the save only makes the next pass report the same payments again (absorbed)."""
    coin = _coin(coin)
    adapter = coins_config.adapter(coin)
    if adapter is None:
        raise PaymentError(gettext("%(coin)s is not configured.") % {"coin": coin})
    now = now or timezone.now()
    cursor = WatcherCursor.objects.get_or_create(coin=coin)[0]
    watch = watch_set(coin, now)
    try:
        result = adapter.scan(watch, dict(cursor.cursor))
        tip_time = adapter.tip_time() if hasattr(adapter, "tip_time") else None
    except Exception as exc:  # the node is down or answers nonsense: stop offering the coin
        coin_health_record(coin=coin, now=now, error=f"{exc.__class__.__name__}: {exc}")
        raise
    if result.rewalked:
        result.reorged = sorted(set(result.reorged) | _gone_from_rewalked(coin, result, watch))
    if "pool" in result.cursor:
        # Write-ahead: the mempool payments this pass applies are remembered before they are
        # applied, with the last pass's (a crash between the two would leave a 0-conf payment
        # recorded that no later pass judges when it leaves the mempool unmined: it held the
        # order's GPUs for the whole monitoring window). The blocks' cursor is saved after.
        pool = {**(cursor.cursor.get("pool") or {}), **result.cursor["pool"]}
        WatcherCursor.objects.filter(pk=cursor.pk).update(cursor={**cursor.cursor, "pool": pool})
    applied = payments_apply_scan(coin=coin, scan=result, now=now)
    caught_up = {"scanned_to": now} if not result.cursor.get("behind") else {}
    WatcherCursor.objects.filter(pk=cursor.pk).update(cursor=result.cursor, updated_at=now, **caught_up)
    coin_health_record(coin=coin, now=now, tip_time=tip_time)
    return applied
