"""Every payment outcome through the services, fed with the adapters' DetectedPayment values:
exact, partial then complete, over, late (balance; confirm re-reserves or refuses when
sold out), duplicate notifications, a watcher killed mid-pass, reorg before settlement,
stale rates; each credited exactly once."""
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import transaction

from billing.models import (
    CoinWallet,
    Invoice,
    LatePaymentClaim,
    LedgerEntry,
    Payment,
    Quote,
    WatcherCursor,
)
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin
from billing.payments.late import late_payment_confirm
from billing.payments.services import (
    PaymentError,
    quote_create,
    sweep_expire_quotes,
    wallet_gap_exceeded,
    watch_coin,
    watch_set,
)
from billing.services import balance_top_up, checkout_place_order
from inventory.models import Node, Offer, Site
from ops.lifecycle import run_lifecycle
from rental.models import Lease, LeaseEvent, LeaseState
from tests.billing.payments_helpers import (
    DUE,
    USD,
    ScriptedAdapter,
    apply,
    balance,
    credits,
    fresh,
    paid,
    set_rate,
)
from tests.factories import order

Q, X = Quote.State, Quote.Exception_


# --- quotes -------------------------------------------------------------------------------

def test_quote_locks_rate_amount_rounded_up_fresh_address_and_uri(catalog, customer, coins, t0):
    set_rate("LTC", "70.00000003", t0 - timedelta(minutes=14))
    _, invoice = order(customer, t0, pay=False)
    quote = quote_create(invoice=invoice, coin="ltc", now=t0)
    # $65 / $70.00000003 = 0.928571425...LTC → rounded UP to the litoshi
    assert int(quote.amount) == 92_857_143
    assert quote.address.startswith("rltc1q") and quote.derivation_index == 0
    assert quote.uri == f"litecoin:{quote.address}?amount=0.92857143&label=Invoice%20{invoice.pk}"
    assert quote.expires_at == invoice.expires_at == t0 + timedelta(minutes=30)
    assert (quote.rate_source, quote.rate_at, quote.state) == ("operator", t0 - timedelta(minutes=14), Q.NEW)
    # the same coin again while unpaid: the same quote (no address burnt); a new one after expiry
    assert quote_create(invoice=invoice, coin="LTC", now=t0 + timedelta(minutes=5)).pk == quote.pk
    assert CoinWallet.objects.get(coin="LTC").next_index == 1


def test_stale_or_missing_rate_unknown_coin_and_closed_invoice_are_refused(catalog, customer, coins, t0):
    _, invoice = order(customer, t0, pay=False)
    with pytest.raises(PaymentError, match="No LTC exchange rate"):
        quote_create(invoice=invoice, coin="LTC", now=t0)
    set_rate("LTC", "100", t0 - timedelta(minutes=16))
    with pytest.raises(PaymentError, match="out of date"):
        quote_create(invoice=invoice, coin="LTC", now=t0)
    with pytest.raises(PaymentError, match="not accepted"):
        quote_create(invoice=invoice, coin="BTC", now=t0)
    with pytest.raises(PaymentError, match="Unknown coin"):
        quote_create(invoice=invoice, coin="DOGE", now=t0)
    set_rate("LTC", "100", t0)
    with pytest.raises(PaymentError, match="no longer open"):
        quote_create(invoice=invoice, coin="LTC", now=t0 + timedelta(minutes=30))
    Invoice.objects.filter(pk=invoice.pk).update(state=Invoice.State.PAID)
    with pytest.raises(PaymentError, match="no longer open"):
        quote_create(invoice=invoice, coin="LTC", now=t0)
    assert not Quote.objects.exists()


def test_stablecoin_pegged_unless_an_operator_rate_overrides(catalog, customer, coins, t0):
    _, invoice = order(customer, t0, pay=False)
    quote = quote_create(invoice=invoice, coin="USDT", now=t0)
    assert int(quote.amount) == 65_000_000 and quote.rate_source == "peg"
    assert quote.uri.startswith("ethereum:0xdAC17F958D2ee523a2206206994597C13D831ec7@31337/transfer?address=0x")
    assert quote.uri.endswith("&uint256=65000000")
    # ERC-20s share the ETH key, so they share its address counter
    assert CoinWallet.objects.get(coin="ETH").next_index == 1
    set_rate("USDC", "1", t0)  # other coins unaffected
    _, other = order(customer, t0, pay=False)
    set_rate("USDT", "0.5", t0)
    assert int(quote_create(invoice=other, coin="USDT", now=t0).amount) == 130_000_000


def test_renewal_quote_gets_a_full_window(catalog, customer, coins, t0):
    set_rate("LTC", "100", t0)
    lease, invoice = order(customer, t0, pay=False)
    Invoice.objects.filter(pk=invoice.pk).update(kind=Invoice.Kind.RENEWAL, expires_at=None,
                                                 term_start=t0 + timedelta(days=7))
    set_rate("LTC", "100", t0 + timedelta(minutes=50))
    quote = quote_create(invoice=fresh(invoice), coin="LTC", now=t0 + timedelta(minutes=50))
    assert quote.expires_at == t0 + timedelta(minutes=80)


def test_gap_limit_warning_after_twenty_unpaid_addresses(catalog, customer, coins, t0, monkeypatch):
    from billing.payments import services as payments

    warnings = []
    monkeypatch.setattr(payments.log, "warning", lambda msg, *args: warnings.append(msg % args))
    set_rate("LTC", "100", t0)
    _, first = order(customer, t0, pay=False)
    quote = quote_create(invoice=first, coin="LTC", now=t0)
    CoinWallet.objects.filter(coin="LTC").update(next_index=19)
    assert not wallet_gap_exceeded(CoinWallet.objects.get(coin="LTC"))
    _, second = order(customer, t0, pay=False)
    q2 = quote_create(invoice=second, coin="LTC", now=t0)
    assert q2.derivation_index == 19 and wallet_gap_exceeded(CoinWallet.objects.get(coin="LTC"))
    assert len(warnings) == 1 and "gap limit" in warnings[0]
    apply(q2, [paid(q2, 1, 0)], t0)  # a payment to index 19: the wallet sees everything again
    assert CoinWallet.objects.get(coin="LTC").highest_paid_index == 19
    assert not wallet_gap_exceeded(CoinWallet.objects.get(coin="LTC"))
    assert quote.derivation_index == 0


# --- outcomes -----------------------------------------------------------------------------

def test_exact_payment_seen_then_confirmed_pays_once(placed, customer, t0):
    lease, invoice, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=5))
    assert (fresh(quote).state, int(quote.received), int(quote.confirmed)) == (Q.PROCESSING, DUE, 0)
    assert fresh(invoice).state == Invoice.State.OPEN
    apply(quote, [replace(p, confirmations=3)], t0 + timedelta(minutes=10))
    assert fresh(quote).state == Q.PROCESSING
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=20))
    assert (fresh(quote).state, quote.exception, int(quote.confirmed)) == (Q.SETTLED, X.NONE, DUE)
    assert fresh(invoice).state == Invoice.State.PAID and invoice.paid_via == "LTC"
    assert fresh(lease).state == LeaseState.PROVISIONING
    assert Payment.objects.get().state == Payment.State.CONFIRMED and credits() == []


def test_partial_then_complete_extends_the_window(placed, t0):
    lease, invoice, quote = placed
    first = paid(quote, 40 * USD, 6)
    apply(quote, [first], t0 + timedelta(minutes=25))
    assert (fresh(quote).state, quote.exception) == (Q.PROCESSING, X.PARTIAL)
    assert quote.expires_at == t0 + timedelta(minutes=55)  # a window past the last payment
    assert fresh(invoice).expires_at == quote.expires_at  # the slots stay held meanwhile
    run_lifecycle(t0 + timedelta(minutes=31))
    assert fresh(lease).state == LeaseState.PENDING
    assert sweep_expire_quotes(t0 + timedelta(minutes=31)) == []
    apply(quote, [paid(quote, 25 * USD, 6)], t0 + timedelta(minutes=40))
    assert (fresh(quote).state, quote.exception, int(quote.confirmed)) == (Q.SETTLED, X.NONE, DUE)
    assert fresh(invoice).state == Invoice.State.PAID and fresh(lease).state == LeaseState.PROVISIONING
    assert credits() == []


def test_partial_extension_is_bounded(placed, t0, settings):
    settings.PARTIAL_PAYMENT_MAX_EXTENSION_MINUTES = 20
    _, _, quote = placed
    for minute in (25, 45, 49):
        apply(quote, [paid(quote, USD, 0)], t0 + timedelta(minutes=minute))
    assert fresh(quote).expires_at == t0 + timedelta(minutes=50)


def test_partial_that_expires_goes_to_the_balance_once_confirmed(placed, customer, t0):
    lease, invoice, quote = placed
    p = paid(quote, 13 * USD, 0)
    apply(quote, [p], t0 + timedelta(minutes=1))
    run_lifecycle(t0 + timedelta(minutes=32))  # quote and order expire at the extended window
    assert sweep_expire_quotes(t0 + timedelta(minutes=32)) == []  # the lifecycle pass did it
    assert (fresh(quote).state, quote.exception) == (Q.EXPIRED, X.PARTIAL)
    assert fresh(invoice).state == Invoice.State.EXPIRED and fresh(lease).state == LeaseState.CANCELLED
    assert balance(customer) == 0  # not confirmed yet
    apply(quote, [paid(quote, 13 * USD, 6, p.txid)], t0 + timedelta(minutes=40))
    apply(quote, [paid(quote, 13 * USD, 7, p.txid)], t0 + timedelta(minutes=41))
    assert credits(LedgerEntry.Kind.LATE_PAYMENT) == [1300] and balance(customer) == 1300


def test_overpayment_settles_and_credits_the_excess_once(placed, customer, t0):
    _, invoice, quote = placed
    scan = [paid(quote, DUE + USD + 1, 6)]
    for _ in range(3):
        apply(quote, scan, t0 + timedelta(minutes=5))
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.OVER)
    assert credits(LedgerEntry.Kind.EXCESS_PAYMENT) == [100]  # 100.0001 cents, rounded down
    # a second payment after settlement is an overpayment too, credited on its own
    apply(quote, [paid(quote, 2 * USD, 6)], t0 + timedelta(minutes=9))
    apply(quote, [paid(quote, 2 * USD, 6)][:0], t0 + timedelta(minutes=9))
    assert sorted(credits(LedgerEntry.Kind.EXCESS_PAYMENT)) == [100, 200] and balance(customer) == 300
    assert fresh(invoice).state == Invoice.State.PAID


def test_underpayment_within_tolerance_settles(placed, t0, settings):
    settings.UNDERPAYMENT_TOLERANCE_BPS = 50  # 0.5 %
    _, invoice, quote = placed
    apply(quote, [paid(quote, DUE - DUE * 50 // 10_000 - 1, 6)], t0)
    assert fresh(quote).state == Q.PROCESSING
    apply(quote, [paid(quote, 1, 6)], t0)
    assert fresh(quote).state == Q.SETTLED and fresh(invoice).state == Invoice.State.PAID


def test_full_amount_seen_on_time_holds_the_slots_until_confirmed(placed, t0):
    lease, invoice, quote = placed
    p = paid(quote, DUE, 0)
    apply(quote, [p], t0 + timedelta(minutes=29))
    assert fresh(invoice).expires_at > t0 + timedelta(hours=1)
    run_lifecycle(t0 + timedelta(minutes=45))
    sweep_expire_quotes(t0 + timedelta(minutes=45))
    assert fresh(lease).state == LeaseState.PENDING and fresh(quote).state == Q.PROCESSING
    apply(quote, [paid(quote, DUE, 6, p.txid)], t0 + timedelta(minutes=50))
    assert fresh(quote).state == Q.SETTLED and fresh(lease).state == LeaseState.PROVISIONING


def test_late_payment_goes_to_balance_and_confirm_reorders(placed, customer, t0):
    lease, invoice, quote = placed
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    assert fresh(quote).state == Q.EXPIRED and fresh(lease).state == LeaseState.CANCELLED
    assert quote in [q for q in Quote.objects.filter(address__in=watch_set(Coin.LTC, later))]
    set_rate("LTC", "100", later)  # a fresh rate when it confirms: credited at it
    apply(quote, [paid(quote, DUE, 6)], later + timedelta(minutes=5))
    assert (fresh(quote).state, quote.exception) == (Q.EXPIRED, X.LATE)
    assert credits(LedgerEntry.Kind.LATE_PAYMENT) == [6500] and balance(customer) == 6500
    assert fresh(invoice).state == Invoice.State.EXPIRED  # not fulfilled automatically

    claimed_at = later + timedelta(minutes=6)       # the service's clock, not the wall's
    new_invoice = late_payment_confirm(quote=quote, customer=customer, now=claimed_at)
    assert new_invoice.pk != invoice.pk and new_invoice.state == Invoice.State.PAID
    assert (new_invoice.created_at, new_invoice.paid_at) == (claimed_at, claimed_at)
    assert new_invoice.lease.state == LeaseState.PROVISIONING and balance(customer) == 0
    assert LatePaymentClaim.objects.get(quote=quote).at == claimed_at
    with pytest.raises(PaymentError) as again:
        late_payment_confirm(quote=quote, customer=customer, now=later + timedelta(minutes=7))
    assert str(again.value) == "This quote has no late payment to use."
    assert LatePaymentClaim.objects.count() == 1 and Lease.objects.count() == 2


def test_late_payment_reorder_of_an_old_lease_leaves_out_the_retired_snapshot_addon(placed, customer, t0):
    """An order placed when "snapshot TB" was still sold: the reorder does not buy it again."""
    lease, invoice, quote = placed
    Lease.objects.filter(pk=lease.pk).update(snapshot_tb=2)
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    set_rate("LTC", "100", later)
    apply(quote, [paid(quote, DUE, 6)], later + timedelta(minutes=5))
    new_invoice = late_payment_confirm(quote=quote, customer=customer, now=later + timedelta(minutes=6))
    assert new_invoice.state == Invoice.State.PAID and new_invoice.amount_cents == 6500
    assert new_invoice.lease.snapshot_tb == 0 and balance(customer) == 0


def test_late_payment_confirm_refused_when_sold_out_money_stays(placed, customer, other_customer, t0):
    lease, invoice, quote = placed
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    set_rate("LTC", "100", later)
    apply(quote, [paid(quote, DUE, 6)], later)
    Node.objects.update(draining=True)
    with pytest.raises(PaymentError) as sold_out:
        late_payment_confirm(quote=quote, customer=customer, now=later)
    assert str(sold_out.value) == "That GPU is sold out now; your payment stays on your balance."
    assert balance(customer) == 6500 and Lease.objects.count() == 1 and not LatePaymentClaim.objects.exists()
    with pytest.raises(PaymentError) as not_theirs:
        late_payment_confirm(quote=quote, customer=other_customer, now=later)
    assert str(not_theirs.value) == "This quote is not yours."


def test_payment_for_an_invoice_paid_another_way_goes_to_balance(placed, customer, t0):
    lease, invoice, quote = placed
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    from billing.services import invoice_pay_from_balance
    invoice_pay_from_balance(invoice=invoice, now=t0)
    scan = [paid(quote, DUE, 6)]
    apply(quote, scan, t0 + timedelta(minutes=3))
    apply(quote, scan, t0 + timedelta(minutes=4))
    assert (fresh(quote).state, quote.exception) == (Q.SETTLED, X.OVER)
    assert credits(LedgerEntry.Kind.EXCESS_PAYMENT) == [6500] and balance(customer) == 6500
    assert LeaseEvent.objects.filter(lease=lease, kind="paid").count() == 1


def test_duplicate_notifications_and_two_watchers_record_one_payment(placed, t0):
    lease, invoice, quote = placed
    p = paid(quote, DUE + USD, 6)
    apply(quote, [p, p], t0)  # twice in one pass
    apply(quote, [p], t0 + timedelta(seconds=1))  # a second watcher
    apply(quote, [p], t0 + timedelta(minutes=2))  # the same watcher, next pass
    assert Payment.objects.count() == 1 and fresh(quote).state == Q.SETTLED
    assert credits() == [100]
    assert LeaseEvent.objects.filter(lease=lease, kind="paid").count() == 1


def test_watcher_killed_after_apply_before_cursor_save_credits_once(placed, customer, t0, monkeypatch):
    _, invoice, quote = placed
    adapter = ScriptedAdapter([paid(quote, DUE + 3 * USD, 6)])
    from billing.payments import services as payments

    real = payments.payments_apply_scan

    def apply_then_die(**kwargs):
        real(**kwargs)
        raise SystemExit("worker killed")

    with coins_config.use_adapters({Coin.LTC: adapter}):
        monkeypatch.setattr(payments, "payments_apply_scan", apply_then_die)
        with pytest.raises(SystemExit):
            watch_coin(coin="LTC", now=t0 + timedelta(minutes=1))
        assert WatcherCursor.objects.get(coin="LTC").cursor == {}
        monkeypatch.setattr(payments, "payments_apply_scan", real)
        watch_coin(coin="LTC", now=t0 + timedelta(minutes=2))  # restarted: re-reports the payment
        watch_coin(coin="LTC", now=t0 + timedelta(minutes=3))
    assert adapter.seen_cursors == [{}, {}, {"pos": 1}]
    assert Payment.objects.count() == 1 and fresh(invoice).state == Invoice.State.PAID
    assert credits() == [300] and balance(customer) == 300


def test_reorg_before_settlement_uncounts_the_payment(placed, t0):
    _, invoice, quote = placed
    a, b = paid(quote, 30 * USD, 2), paid(quote, 35 * USD, 1)
    apply(quote, [a, b], t0 + timedelta(minutes=1))
    assert (fresh(quote).state, int(quote.received)) == (Q.PROCESSING, DUE)
    apply(quote, [], t0 + timedelta(minutes=2), reorged=[(b.txid, 0)])
    assert (fresh(quote).state, quote.exception, int(quote.received)) == (Q.PROCESSING, X.PARTIAL, 30 * USD)
    assert Payment.objects.get(txid=b.txid).state == Payment.State.REORGED
    apply(quote, [paid(quote, 30 * USD, 6, a.txid)], t0 + timedelta(minutes=3))
    assert fresh(quote).state == Q.PROCESSING and fresh(invoice).state == Invoice.State.OPEN  # 35 un-counted
    apply(quote, [], t0 + timedelta(minutes=4), reorged=[(a.txid, 0)])
    assert (fresh(quote).state, int(quote.received)) == (Q.INVALID, 0)  # every payment left the chain
    # the transaction comes back (re-mined): counted again
    apply(quote, [paid(quote, 35 * USD, 6, b.txid), paid(quote, 30 * USD, 6, a.txid)], t0 + timedelta(minutes=5))
    assert fresh(quote).state == Q.SETTLED and fresh(invoice).state == Invoice.State.PAID


def test_invalid_quote_past_its_window_expires(placed, t0):
    _, _, quote = placed
    a = paid(quote, DUE, 0)
    apply(quote, [a], t0 + timedelta(minutes=1))
    apply(quote, [], t0 + timedelta(minutes=2), reorged=[(a.txid, 0)])
    assert fresh(quote).state == Q.INVALID
    sweep_expire_quotes(t0 + timedelta(minutes=30))
    assert (fresh(quote).state, quote.exception) == (Q.EXPIRED, X.NONE)


def test_unpaid_quote_expires_and_stays_in_the_watch_set(placed, t0):
    """LTC matches outputs against a set: it watches every address it gave, also past
    LATE_PAYMENT_WATCH_DAYS, so a payment that late is recorded (for an operator)."""
    _, _, quote = placed
    assert sweep_expire_quotes(t0 + timedelta(minutes=29)) == []
    assert len(sweep_expire_quotes(t0 + timedelta(minutes=30))) == 1
    assert fresh(quote).state == Q.EXPIRED and sweep_expire_quotes(t0 + timedelta(minutes=31)) == []
    assert watch_set(Coin.LTC, t0 + timedelta(days=6)) == {quote.address}
    assert watch_set(Coin.LTC, t0 + timedelta(days=8)) == {quote.address}


def test_unknown_address_is_reported_not_credited(placed, t0):
    _, _, quote = placed
    stray = replace(paid(quote, USD, 6), address="rltc1qunknown")
    result = apply("LTC", [stray], t0)
    assert result.unknown == [stray] and not Payment.objects.exists()


class FakeMoneroRpc:
    def __init__(self):
        self.created = 0

    def call(self, method, **params):
        assert method == "create_address" and params["account_index"] == 0
        self.created += 1
        return {"address": f"8{self.created:094d}", "address_index": self.created}


def test_xmr_subaddress_and_sol_reference_quotes(catalog, customer, t0):
    from billing.payments.coins.monero import MoneroAdapter
    from billing.payments.coins.solana import SolanaAdapter, is_public_key

    merchant = "9WzDXwBbmkg8ZTbNMqUxvQRAyrZzDsGYdLVL9zYtAWWM"
    set_rate("XMR", "150", t0)
    set_rate("SOL", "130", t0)
    adapters = {Coin.XMR: MoneroAdapter(FakeMoneroRpc()), Coin.SOL: SolanaAdapter(merchant)}
    with coins_config.use_adapters(adapters):
        _, invoice = order(customer, t0, pay=False)
        xmr = quote_create(invoice=invoice, coin="XMR", now=t0)
        sol = quote_create(invoice=invoice, coin="SOL", now=t0)
        assert (xmr.derivation_index, xmr.address) == (1, "8" + "0" * 93 + "1")
        assert xmr.uri.startswith(f"monero:{xmr.address}?tx_amount=0.433333333334")  # $65 / $150, rounded up
        assert sol.address == merchant and is_public_key(sol.reference)
        assert sol.uri.startswith(f"solana:{merchant}?amount=0.5&reference={sol.reference}")
        assert watch_set(Coin.SOL, t0) == {sol.reference: True} and watch_set(Coin.XMR, t0) == {xmr.address: 1}
        apply(sol, [paid(sol, 500_000_000, 1)], t0 + timedelta(minutes=1))  # found by its reference
    assert fresh(sol).state == Q.SETTLED and fresh(invoice).state == Invoice.State.PAID
    assert not CoinWallet.objects.exists()  # no derivation counter for XMR / SOL


def _claimable(quote, *, invoice=None, claim=False, review=None, **quote_changes) -> bool:
    """late_payment_claimable with the quote (and its invoice, claim or review) changed, the
    changes rolled back after."""
    from billing.models import PaymentReview
    from billing.payments.late import late_payment_claimable

    with transaction.atomic():
        if quote_changes:
            Quote.objects.filter(pk=quote.pk).update(**quote_changes)
        if invoice:
            Invoice.objects.filter(pk=quote.invoice_id).update(state=invoice)
        if claim:
            LatePaymentClaim.objects.create(quote=quote, invoice=quote.invoice, at=quote.expires_at)
        if review:
            PaymentReview.objects.filter(quote=quote).update(state=review)
        result = late_payment_claimable(fresh(quote))
        transaction.set_rollback(True)
    return result


def test_a_late_payment_is_claimable_only_while_every_condition_holds(placed, t0):
    """Term by term: a closed quote (expired or settled), paid late or partly, with confirmed
    coins credited to the balance, for an invoice not paid since, never claimed before."""
    _lease, _invoice, quote = placed
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    set_rate("LTC", "100", later)
    apply(quote, [paid(quote, DUE, 6)], later + timedelta(minutes=5))
    assert _claimable(quote)
    assert [s for s in Q.values if _claimable(quote, state=s)] == [Q.SETTLED, Q.EXPIRED]
    assert [x for x in X.values if _claimable(quote, exception=x)] == [X.PARTIAL, X.LATE]
    assert not _claimable(quote, confirmed=0) and _claimable(quote, confirmed=1)
    assert [s for s in Invoice.State.values if _claimable(quote, invoice=s)] == [
        Invoice.State.OPEN, Invoice.State.EXPIRED, Invoice.State.VOID]
    assert not _claimable(quote, claim=True)


def test_a_late_payment_worth_one_cent_is_claimable(placed, t0):
    """The smallest late credit still reached the balance: one cent is something to use."""
    _lease, _invoice, quote = placed
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    set_rate("LTC", "100", later)
    apply(quote, [paid(quote, USD // 100, 6)], later + timedelta(minutes=5))    # 0.0001 LTC at $100
    assert credits(LedgerEntry.Kind.LATE_PAYMENT) == [1] and _claimable(quote)


def test_a_late_payment_held_for_an_operator_is_claimable_once_credited(placed, t0):
    """No fresh rate when the late coins confirmed: nothing reached the balance by itself,
    the payment waits for an operator; only a credited review makes it claimable."""
    from billing.models import PaymentReview

    _lease, _invoice, quote = placed
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    apply(quote, [paid(quote, DUE, 6)], later + timedelta(days=2))     # the rate is stale by then
    assert credits() == [] and PaymentReview.objects.filter(quote=quote, state=PaymentReview.State.OPEN).exists()
    assert not _claimable(quote)
    assert [s for s in PaymentReview.State.values if _claimable(quote, review=s)] == [PaymentReview.State.CREDITED]


def test_a_late_payment_reorders_the_same_order_term_image_key_and_add_ons(catalog, customer, coins, t0):
    """The reorder buys what the expired order was: its offer, site, a month, its image and
    SSH key, and its add-ons (the non-zero ones), paid from the balance the late coins reached."""
    from rental.models import Image
    from tests.factories import KEY

    set_rate("LTC", "100", t0)
    lease, invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="DFW-1"),
        term="month", image=Image.objects.get(slug="cuda-12.4-base"), ssh_public_key=KEY,
        addons={"extra_nvme_tb": 1}, pay_from_balance=False, now=t0)
    quote = quote_create(invoice=invoice, coin="LTC", now=t0)
    later = t0 + timedelta(minutes=31)
    run_lifecycle(later)
    sweep_expire_quotes(later)
    set_rate("LTC", "100", later)
    apply(quote, [paid(quote, int(fresh(quote).amount), 6)], later + timedelta(minutes=5))
    assert balance(customer) == invoice.amount_cents
    new = late_payment_confirm(quote=quote, customer=customer, now=later + timedelta(minutes=6)).lease
    same = ("offer_id", "site_id", "term", "image_id", "ssh_public_key", "extra_nvme_tb", "network_volume_tb")
    assert [getattr(new, f) for f in same] == [getattr(lease, f) for f in same]
    assert (new.term, new.extra_nvme_tb) == ("month", 1) and balance(customer) == 0


def _renewal_paid_late(customer, t0, settings):
    """An active lease's renewal invoice, its LTC quote expired unpaid and paid after."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    lease, _ = order(customer, t0)
    run_lifecycle(t0)
    at = fresh(lease).ends_at - timedelta(hours=23)
    run_lifecycle(at)
    renewal = Invoice.objects.get(lease=lease, kind=Invoice.Kind.RENEWAL)
    set_rate("LTC", "100", at)
    quote = quote_create(invoice=renewal, coin="LTC", now=at)
    late = quote.expires_at + timedelta(minutes=1)
    sweep_expire_quotes(late)
    set_rate("LTC", "100", late)
    apply(quote, [paid(quote, DUE, 6)], late)
    assert (fresh(quote).state, quote.exception, balance(customer)) == (Q.EXPIRED, X.LATE, 6500)
    return lease, renewal, quote, late


def test_a_late_payment_pays_the_renewal_invoice_still_open(catalog, customer, coins, t0, settings):
    lease, renewal, quote, late = _renewal_paid_late(customer, t0, settings)
    ends_at = fresh(lease).ends_at
    assert late_payment_confirm(quote=quote, customer=customer, now=late) == renewal
    assert fresh(renewal).state == Invoice.State.PAID and balance(customer) == 0
    assert fresh(renewal).paid_at == late                     # the service's clock, not the wall's
    paid_by = LedgerEntry.objects.get(invoice=renewal, kind=LedgerEntry.Kind.RENEWAL)
    assert paid_by.actor == customer                          # the customer chose to use it
    assert fresh(lease).ends_at == ends_at + timedelta(days=7) and Lease.objects.count() == 1
    assert LatePaymentClaim.objects.get(quote=quote).invoice == renewal


def test_a_late_payment_for_a_renewal_no_longer_open_stays_on_the_balance(catalog, customer, coins, t0, settings):
    """A renewal is not a new order: once its invoice closed (the lease ended), its late
    payment is not spent on anything; the customer is told it stays on the balance."""
    lease, renewal, quote, late = _renewal_paid_late(customer, t0, settings)
    Invoice.objects.filter(pk=renewal.pk).update(state=Invoice.State.VOID)
    with pytest.raises(PaymentError) as refused:
        late_payment_confirm(quote=quote, customer=customer, now=late)
    assert str(refused.value) == f"Invoice #{renewal.pk} is void; the payment stays on your balance."
    assert balance(customer) == 6500 and not LatePaymentClaim.objects.exists() and Lease.objects.count() == 1
