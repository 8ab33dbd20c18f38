"""The watcher pass and what it reports besides payments (the mutation run's record of the payment
rules): a pass records when it ran and how far it has seen the chain — a pass that is still
catching up with the chain (``behind``) keeps the orders waiting for it open —, a coin that
is not configured is not watched, and a token we do not take, sent to a quote's address,
is put before the operators once per transfer and never credited. Last, a partly paid
quote keeps the order's slots for its window (a defect when its payment comes back)."""
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from billing.models import Invoice, LedgerEntry, Payment, PaymentReview, Quote, WatcherCursor
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, ScanResult
from billing.payments.pricing import PaymentError
from billing.payments.services import payments_apply_scan, quote_create, watch_coin
from inventory.models import AuditEntry
from ops.backoffice.dashboard import dashboard
from ops.lifecycle import run_lifecycle
from rental.models import LeaseState
from tests.billing.payments_helpers import USD, apply, fresh, offline_adapters, paid
from tests.factories import order

pytestmark = pytest.mark.django_db


class CatchingUpAdapter:
    """The offline LTC adapter (addresses) whose node finds nothing, and whose passes return
    the cursors given, one per pass (``behind``: the pass stopped short of the node's tip)."""

    def __init__(self, cursors, tip):
        self.inner, self.cursors, self.tip = offline_adapters()[Coin.LTC], list(cursors), tip

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def scan(self, watch, cursor):
        return ScanResult([], self.cursors.pop(0), [])

    def tip_time(self):
        return self.tip


def cursor_row(coin="LTC"):
    row = WatcherCursor.objects.get(coin=coin)
    return row.cursor, row.updated_at, row.last_ok_at, row.scanned_to, row.last_error


# --- the watcher pass ------------------------------------------------------------------------

def test_an_order_stays_open_while_its_coins_watcher_is_still_catching_up_with_the_chain(placed, t0):
    lease, invoice, quote = placed
    deadline = fresh(invoice).expires_at
    assert deadline == quote.expires_at == t0 + timedelta(minutes=30)
    tip = int(t0.timestamp())
    passes = [{"height": 100}, {"height": 150, "behind": True}, {"height": 200}]
    with coins_config.use_adapters({Coin.LTC: CatchingUpAdapter(passes, tip)}):
        first = t0 + timedelta(minutes=1)
        watch_coin(coin="LTC", now=first)  # reached the tip: payments until then are seen
        assert cursor_row() == ({"height": 100}, first, first, first, "")
        assert WatcherCursor.objects.get(coin="LTC").tip_time == datetime.fromtimestamp(tip, tz=UTC)

        catching_up = deadline + timedelta(minutes=5)
        watch_coin(coin="LTC", now=catching_up)  # a pass that stopped short of the tip
        assert cursor_row() == ({"height": 150, "behind": True}, catching_up, catching_up, first, "")
        run_lifecycle(catching_up + timedelta(minutes=1))  # a payment dated on time may still be found
        assert fresh(invoice).state == Invoice.State.OPEN and fresh(quote).state == Quote.State.NEW
        assert fresh(lease).state == LeaseState.PENDING

        caught_up = deadline + timedelta(minutes=10)
        watch_coin(coin="LTC", now=caught_up)
        assert cursor_row() == ({"height": 200}, caught_up, caught_up, caught_up, "")
        run_lifecycle(caught_up + timedelta(minutes=1))
    assert fresh(quote).state == Quote.State.EXPIRED and fresh(invoice).state == Invoice.State.EXPIRED
    assert fresh(lease).state == LeaseState.CANCELLED


def test_a_coin_that_is_not_configured_is_not_watched(coins, t0):
    with pytest.raises(PaymentError) as refused:
        watch_coin(coin="btc", now=t0)
    assert str(refused.value) == "BTC is not configured."
    assert not WatcherCursor.objects.exists()


# --- a token we do not take ------------------------------------------------------------------

STRAY = "0x" + "5" * 40  # a token contract that is not USDT's nor USDC's
TX = "0x" + "a" * 64


def foreign(*deposits):
    return ScanResult([], {}, [], foreign=list(deposits))


def test_a_token_we_do_not_take_is_shown_to_the_operators_once_per_transfer_and_never_credited(
        catalog, customer, coins, t0):
    _, invoice_a = order(customer, t0, pay=False)
    _, invoice_b = order(customer, t0, pay=False)
    a = quote_create(invoice=invoice_a, coin="USDT", now=t0)
    b = quote_create(invoice=invoice_b, coin="USDT", now=t0)
    now = t0 + timedelta(minutes=2)
    stray = {"token": STRAY, "txid": TX, "log_index": 3, "to": b.address, "value": "3000000"}
    same_tx = {**stray, "log_index": 4, "value": "1000000"}  # a second transfer in the same transaction
    other_tx = {**stray, "txid": "0x" + "c" * 64, "value": "2000000"}  # same log index, another transaction
    nobodys = {**stray, "txid": "0x" + "d" * 64, "to": "0x" + "9" * 40}  # an address that is no quote's
    for _ in range(2):  # the watcher reports the same transfers again (restart, second watcher)
        payments_apply_scan(coin="USDT", scan=foreign(stray, same_tx, other_tx, nobodys), now=now)
    # ETH the node cannot trace, to two quotes in one block: one entry per quote, keyed by the block
    block = "0x" + "b" * 64
    untraced = [{"token": "ETH", "txid": block, "log_index": -1, "to": q.address, "value": "10000000000000000",
                 "untraced": True} for q in (a, b)]
    for _ in range(2):
        payments_apply_scan(coin="ETH", scan=foreign(*untraced), now=now)

    rows = AuditEntry.objects.filter(action="wrong_token_deposit").order_by("pk")
    assert [(r.actor, r.object_type, r.object_id, r.detail) for r in rows] == [
        (None, "billing.Quote", str(b.pk), stray),
        (None, "billing.Quote", str(b.pk), same_tx),
        (None, "billing.Quote", str(b.pk), other_tx),
        (None, "billing.Quote", str(a.pk), untraced[0]),
        (None, "billing.Quote", str(b.pk), untraced[1]),
    ]
    assert ("5 deposit(s) of a token we do not take, to quote addresses, in the last 7 days "
            "(audit log: wrong_token_deposit)") in dashboard(timezone.now()).alerts
    # none of it pays a quote or reaches a balance: the operators return it on request
    assert [fresh(q).state for q in (a, b)] == [Quote.State.NEW, Quote.State.NEW]
    assert [int(fresh(q).received) for q in (a, b)] == [0, 0]
    assert fresh(invoice_a).state == fresh(invoice_b).state == Invoice.State.OPEN
    assert not Payment.objects.exists() and not PaymentReview.objects.exists()
    assert not LedgerEntry.objects.exists()


# --- a partly paid quote holds the order's slots ------------------------------------------

def test_a_partly_paid_quote_whose_payment_comes_back_holds_the_order_for_its_window(placed, t0):
    """_extend_partial / _hold_invoice: a partly paid quote stays open a window past its
    payment, and the order's slots are kept while its payment arrives — also when that
    payment left the mempool and came back mined."""
    lease, invoice, a = placed  # LTC, $65 at $100/LTC; the order's window and the quote's end at t0+30
    b = quote_create(invoice=invoice, coin="USDT", now=t0)  # the customer also took a USDT quote
    part = paid(a, 30 * USD, 0)
    apply(a, [part], t0 + timedelta(minutes=5))  # $30 in the mempool: open 30 min past it, the order too
    extended = t0 + timedelta(minutes=35)
    assert fresh(a).expires_at == fresh(invoice).expires_at == extended
    payments_apply_scan(coin="LTC", scan=ScanResult([], {}, [], dropped=[(part.txid, 0, "evicted")]),
                        now=t0 + timedelta(minutes=8))
    assert fresh(a).state == Quote.State.INVALID
    dust = paid(b, 1, 0)  # a USDT transfer to the other quote comes and goes
    apply(b, [dust], t0 + timedelta(minutes=9))
    payments_apply_scan(coin="USDT", scan=ScanResult([], {}, [], dropped=[(dust.txid, 0, "evicted")]),
                        now=t0 + timedelta(minutes=10))
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=30)  # nothing arriving: the order's own window
    # the evicted $30 is mined after all: the quote is partly paid again, open until t0+35
    apply(a, [replace(part, confirmations=1, block_hash="b" * 64, block_height=100)], t0 + timedelta(minutes=12))
    a = fresh(a)
    assert (a.state, a.exception, a.expires_at) == (Quote.State.PROCESSING, Quote.Exception_.PARTIAL, extended)
    run_lifecycle(t0 + timedelta(minutes=31))
    assert (fresh(invoice).state, fresh(invoice).expires_at) == (Invoice.State.OPEN, extended)
    assert fresh(lease).state == LeaseState.PENDING
