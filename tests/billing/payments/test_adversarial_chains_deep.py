"""Money on real local chains, the cases past the watcher's memory and its crashes: a reorg
deeper than the 100 block hashes a cursor remembers (litecoind, anvil), a misdirected
transfer that leaves the chain before or after an operator credited it, a payment or a
settlement's excess held over the automatic cap that a reorg drops, a watcher killed
between applying a pass and saving its cursor, and payments to EVM quote addresses long
after the late-payment window. Each test asserts the ledger, the reviews and the invoice.

The chain fixtures are the session fixtures of tests/billing/chain_daemons.py, started
for this module (deep reorgs here do not move the other modules' nodes)."""
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import CoinWallet, Invoice, Payment, PaymentReview, Quote, WatcherCursor
from billing.payments import config as coins_config
from billing.payments import services as payment_services
from billing.payments.coins.base import Coin
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.walker import KEEP_HASHES
from billing.payments.credits import payment_review_credit
from billing.payments.pricing import PaymentError
from billing.payments.services import quote_create, watch_coin
from inventory.models import AuditEntry
from ops.lifecycle import run_lifecycle
from rental.models import LeaseState
from tests.billing.chain_payments import (
    CONTRACT,
    balance,
    deploy,
    ledger,
    ltc,
    ltc_quote,
    rbf_payment,
    steal_back,
)
from tests.billing.payments_helpers import eth_account_key, fresh, set_rate
from tests.factories import order

pytestmark = pytest.mark.django_db(transaction=False)


def rpc(w3, method, *params):
    """An anvil call that must succeed (a refused reorg must not pass as a quiet chain)."""
    reply = w3.provider.make_request(method, list(params))
    assert "error" not in reply, reply
    return reply["result"]


# --- a reorg deeper than the watcher's memory --------------------------------------------------

def test_ltc_settled_payment_gone_in_a_reorg_deeper_than_the_watchers_memory_is_reversed(
        litecoind, catalog, customer, settings):
    """Settled, then buried under more than KEEP_HASHES blocks (the cursor no longer tracks
    it), then a reorg from below it whose chain double-spends it: every hash the cursor
    remembers differs, the watcher locates the fork with its anchors, walks again from
    there, and the payment that is not found again is reversed."""
    settings.PAYMENT_SPEED_POLICY = "10000:1"
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 20000)
        watch_coin(coin="LTC")
        _, coin = rbf_payment(litecoind, quote.address, Decimal("0.65"))
        (block,) = litecoind.mine(1)
        watch_coin(coin="LTC")
        assert fresh(invoice).state == Invoice.State.PAID
        litecoind.mine(KEEP_HASHES + 5)
        watch_coin(coin="LTC")
        assert not WatcherCursor.objects.get(coin="LTC").cursor["tracked"]  # out of its memory

        litecoind.rpc.call("invalidateblock", block)  # 106 blocks deep
        steal_back(litecoind, coin)
        litecoind.mine(KEEP_HASHES + 8, fresh=True)
        watch_coin(coin="LTC")
        watch_coin(coin="LTC")  # reversed once

    assert Payment.objects.get().state == Payment.State.REORGED
    assert ledger(customer) == [("clawback", -6500)] and balance(customer) == -6500
    assert fresh(invoice).flag == "payment_reversed"
    assert PaymentReview.objects.get().kind == "reversed"
    assert "recheck_to" not in WatcherCursor.objects.get(coin="LTC").cursor  # the re-walk is done


def test_eth_payment_gone_in_a_reorg_deeper_than_the_watchers_memory_is_reversed_and_one_kept_is_not(
        anvil, catalog, customer, settings):
    """anvil: two orders paid, more than KEEP_HASHES blocks on top, then a deeper reorg whose
    chain has only the second payment (re-mined): the first is reversed, the second is the
    same payment as before — no claw-back, no second credit."""
    w3, now = anvil, timezone.now()
    settings.MAX_OPEN_UNPAID_ORDERS = 3
    set_rate("ETH", "2000", now)
    CoinWallet.objects.create(coin="ETH", next_index=20000, highest_paid_index=19999)
    rpc(w3, "anvil_mine", 10)  # a chain long enough to reorg from below the watcher's start
    with coins_config.use_adapters({Coin.ETH: EvmAdapter(Coin.ETH, eth_account_key(), w3=w3, chain_id=31337)}):
        _, inv1 = order(customer, now, pay=False)
        _, inv2 = order(customer, now, pay=False)
        q1, q2 = (quote_create(invoice=i, coin="ETH", now=now) for i in (inv1, inv2))
        watch_coin(coin="ETH")
        w3.eth.send_transaction({"from": w3.eth.accounts[3], "to": q1.address, "value": int(q1.amount)})
        kept = w3.eth.send_transaction({"from": w3.eth.accounts[4], "to": q2.address, "value": int(q2.amount)})
        raw = w3.provider.make_request("eth_getRawTransactionByHash", [kept.to_0x_hex()])["result"]
        rpc(w3, "anvil_mine", 12)
        watch_coin(coin="ETH")
        assert fresh(inv1).state == fresh(inv2).state == Invoice.State.PAID
        rpc(w3, "anvil_mine", KEEP_HASHES + 5)
        watch_coin(coin="ETH")

        rpc(w3, "anvil_reorg", KEEP_HASHES + 20, [[raw, 0]])
        watch_coin(coin="ETH")
        watch_coin(coin="ETH")

    p1, p2 = (Payment.objects.get(quote=q) for q in (q1, q2))
    assert p1.state == Payment.State.REORGED and p2.state == Payment.State.CONFIRMED
    assert ledger(customer) == [("clawback", -6500)]
    assert fresh(inv1).flag == "payment_reversed" and fresh(inv2).flag == ""


# --- misdirected transfers that leave the chain -----------------------------------------------

def test_misdirected_review_closes_when_its_transfer_is_reorged_out_and_a_credited_one_is_taken_back(
        anvil, catalog, customer, operator, settings):
    """USDC sent to two USDT quotes: two reviews. An operator credits one; then a reorg leaves
    both transfers out. The open review is closed (crediting it now is refused) and the
    credited one is taken back; when the transfers are mined again, the open one opens again
    and what was taken is given back — each once."""
    w3, now = anvil, timezone.now()
    settings.MAX_OPEN_UNPAID_ORDERS = 3
    set_rate("ETH", "2000", now)
    CoinWallet.objects.create(coin="ETH", next_index=20100, highest_paid_index=20099)
    usdt, usdc = deploy(w3, CONTRACT, 10**15), deploy(w3, CONTRACT, 10**15)
    key, known = eth_account_key(), (usdt.address, usdc.address)
    adapters = {c: EvmAdapter(c, key, w3=w3, chain_id=31337, token=t, known_tokens=known)
                for c, t in ((Coin.USDT, usdt.address), (Coin.USDC, usdc.address))}
    with coins_config.use_adapters(adapters):
        quotes = [quote_create(invoice=order(customer, now, pay=False)[1], coin="USDT", now=now) for _ in range(2)]
        watch_coin(coin="USDC")
        sent = [usdc.functions.transfer(q.address, 65_000_000).transact({"from": w3.eth.accounts[0]}) for q in quotes]
        raws = [w3.provider.make_request("eth_getRawTransactionByHash", [s.to_0x_hex()])["result"] for s in sent]
        rpc(w3, "anvil_mine", 12)
        watch_coin(coin="USDC")
        first, second = (PaymentReview.objects.get(quote=q, kind="misdirected") for q in quotes)
        payment_review_credit(review=second, actor=operator, now=timezone.now())
        assert ledger(customer) == [("late_payment", 6500)]

        rpc(w3, "anvil_reorg", 12, [])  # a chain without either transfer (the contracts stay)
        watch_coin(coin="USDC")
        watch_coin(coin="USDC")
        assert (fresh(first).state, fresh(second).state) == ("closed", "credited")
        with pytest.raises(PaymentError):
            payment_review_credit(review=fresh(first), actor=operator, now=timezone.now())
        assert ledger(customer) == [("late_payment", 6500), ("clawback", -6500)] and balance(customer) == 0

        for raw in raws:  # the sender's wallet broadcasts them again
            w3.provider.make_request("eth_sendRawTransaction", [raw])
        rpc(w3, "anvil_mine", 12)
        watch_coin(coin="USDC")
        watch_coin(coin="USDC")

    assert fresh(first).state == "open" and PaymentReview.objects.count() == 2
    assert ledger(customer) == [("late_payment", 6500), ("clawback", -6500), ("restored", 6500)]
    payment_review_credit(review=fresh(first), actor=operator, now=timezone.now())
    assert balance(customer) == 13000


def test_usdt_payment_held_over_the_cap_closes_its_review_when_a_reorg_drops_it_and_reopens_it_when_mined_again(
        anvil, catalog, customer, operator, settings):
    """The generated histories' finding (ADR 0009): 86.66 USDT to an expired $65 quote is
    over its automatic cap, so it waits in an ``over_cap`` review. A 4-block reorg drops it
    (not re-mined): the review is closed — an operator can no longer credit money no chain
    holds — with an audit row. Broadcast and mined again, the review opens again and the
    operator's credit goes through, once."""
    w3, now = anvil, timezone.now()
    settings.RATE_MAX_AGE_MINUTES = 100_000
    set_rate("USDT", "1", now)
    CoinWallet.objects.create(coin="ETH", next_index=20400, highest_paid_index=20399)
    usdt = deploy(w3, CONTRACT, 10**15)
    adapter = EvmAdapter(Coin.USDT, eth_account_key(), w3=w3, chain_id=31337, token=usdt.address,
                         required_confirmations=3)
    with coins_config.use_adapters({Coin.USDT: adapter}):
        _, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="USDT", now=now)
        later = quote.expires_at + timedelta(minutes=1)
        watch_coin(coin="USDT", now=later)
        run_lifecycle(later)
        assert fresh(quote).state == Quote.State.EXPIRED
        sent = usdt.functions.transfer(quote.address, 86_660_000).transact({"from": w3.eth.accounts[0]})
        raw = w3.provider.make_request("eth_getRawTransactionByHash", [sent.to_0x_hex()])["result"]
        rpc(w3, "anvil_mine", 4)
        watch_coin(coin="USDT", now=later)
        review = PaymentReview.objects.get(quote=quote)
        assert (review.kind, review.state, review.proposed_cents) == ("over_cap", "open", 8666)

        rpc(w3, "anvil_reorg", 4, [])  # dropped, not re-mined
        watch_coin(coin="USDT", now=later)
        watch_coin(coin="USDT", now=later)
        assert Payment.objects.get().state == Payment.State.REORGED
        assert fresh(review).state == "closed"
        assert AuditEntry.objects.filter(action="payment_review_closed", object_id=str(review.pk)).count() == 1
        with pytest.raises(PaymentError):
            payment_review_credit(review=fresh(review), actor=operator, now=later)
        assert ledger(customer) == [] and balance(customer) == 0

        w3.provider.make_request("eth_sendRawTransaction", [raw])  # the payer's wallet sends it again
        rpc(w3, "anvil_mine", 4)
        watch_coin(coin="USDT", now=later)
        watch_coin(coin="USDT", now=later)

    assert Payment.objects.get().state == Payment.State.CONFIRMED
    assert fresh(review).state == "open" and PaymentReview.objects.count() == 1
    payment_review_credit(review=fresh(review), actor=operator, now=later)
    assert ledger(customer) == [("late_payment", 8666)]


@contextmanager
def usdt_overpaid(w3, customer, now, *, first_index: int):
    """An order quoted in USDT (at 1 USD) and paid 86.66 + 65 on time, both mined 3 blocks
    deep and watched: the invoice is paid and 86.66 of excess, over the automatic cap, waits
    for an operator. Yields (invoice, that review, the two raw transactions, to send again)
    with the USDT adapter in use."""
    set_rate("USDT", "1", now)
    CoinWallet.objects.create(coin="ETH", next_index=first_index, highest_paid_index=first_index - 1)
    usdt = deploy(w3, CONTRACT, 10**15)
    adapter = EvmAdapter(Coin.USDT, eth_account_key(), w3=w3, chain_id=31337, token=usdt.address,
                         required_confirmations=3)
    with coins_config.use_adapters({Coin.USDT: adapter}):
        _, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="USDT", now=now)
        watch_coin(coin="USDT", now=now)
        sent = [usdt.functions.transfer(quote.address, units).transact({"from": w3.eth.accounts[0]})
                for units in (86_660_000, 65_000_000)]
        raws = [w3.provider.make_request("eth_getRawTransactionByHash", [s.to_0x_hex()])["result"] for s in sent]
        rpc(w3, "anvil_mine", 4)
        watch_coin(coin="USDT", now=now)
        yield invoice, PaymentReview.objects.get(quote=quote, payment=None), raws


@pytest.mark.parametrize("credited", [False, True], ids=["waiting", "credited"])
def test_usdt_settlement_excess_over_the_cap_follows_its_payments_off_the_chain_and_back(
        anvil, catalog, customer, operator, settings, credited):
    """86.66 + 65 USDT on time pay a $65 order: the excess (86.66) is over the automatic cap
    and waits in a review of the quote. A 4-block reorg drops both payments. Waiting, the
    review is closed (crediting it is refused); credited by an operator, the credit is taken
    back with the invoice's 65. Broadcast and mined again, what was taken is given back and
    the excess is proposed again (a new review) — the store holds what the chain does."""
    w3, now = anvil, timezone.now()
    with usdt_overpaid(w3, customer, now, first_index=20600 + 10 * credited) as (invoice, excess, raws):
        assert fresh(invoice).state == Invoice.State.PAID
        assert (excess.kind, excess.state, excess.proposed_cents) == ("over_cap", "open", 8666)
        if credited:
            payment_review_credit(review=excess, actor=operator, now=now)

        rpc(w3, "anvil_reorg", 4, [])  # dropped, not re-mined
        watch_coin(coin="USDT", now=now)
        watch_coin(coin="USDT", now=now)
        assert set(Payment.objects.values_list("state", flat=True)) == {Payment.State.REORGED}
        if credited:
            assert fresh(excess).state == "credited"
            assert ledger(customer) == [("late_payment", 8666), ("clawback", -15166)]
        else:
            assert fresh(excess).state == "closed"
            with pytest.raises(PaymentError):
                payment_review_credit(review=fresh(excess), actor=operator, now=now)
            assert ledger(customer) == [("clawback", -6500)]
        assert balance(customer) == -6500  # the invoice's 65 is owed; nothing held for an operator
        assert not PaymentReview.objects.filter(kind="over_cap", state="open").exists()

        for raw in raws:  # the payer's wallet sends them again
            w3.provider.make_request("eth_sendRawTransaction", [raw])
        rpc(w3, "anvil_mine", 4)
        watch_coin(coin="USDT", now=now)
        watch_coin(coin="USDT", now=now)

    assert set(Payment.objects.values_list("state", flat=True)) == {Payment.State.CONFIRMED}
    held = PaymentReview.objects.filter(kind="over_cap", state="open")
    if credited:
        assert ledger(customer) == [("late_payment", 8666), ("clawback", -15166), ("restored", 15166)]
        assert balance(customer) == 8666 and not held.exists()
    else:
        assert ledger(customer) == [("clawback", -6500), ("restored", 6500)]
        assert balance(customer) == 0 and [r.proposed_cents for r in held] == [8666]


def test_usdt_settlement_excess_over_the_cap_shrinks_when_one_payment_is_dropped_and_grows_back(
        anvil, catalog, customer, settings):
    """The same settlement (86.66 + 65 USDT for $65, the 86.66 excess waiting over the cap); the
    reorg re-mines the 86.66 and drops the 65. The settlement still pays the invoice and 21.66
    beyond it, which is under the cap: the review of 86.66 is closed and 21.66 credited. The
    65 mined again, the 65 more excess waits in a new review."""
    w3, now = anvil, timezone.now()
    with usdt_overpaid(w3, customer, now, first_index=20700) as (invoice, excess, raws):
        assert (excess.state, excess.proposed_cents) == ("open", 8666)

        rpc(w3, "anvil_reorg", 4, [[raws[0], 0]])  # the 86.66 re-mined, the 65 dropped
        watch_coin(coin="USDT", now=now)
        watch_coin(coin="USDT", now=now)
        assert fresh(invoice).state == Invoice.State.PAID and fresh(excess).state == "closed"
        assert ledger(customer) == [("excess_payment", 2166)]
        assert not PaymentReview.objects.filter(kind="over_cap", state="open").exists()

        w3.provider.make_request("eth_sendRawTransaction", [raws[1]])
        rpc(w3, "anvil_mine", 4)
        for _ in range(2):
            watch_coin(coin="USDT", now=now)

    assert ledger(customer) == [("excess_payment", 2166)]
    assert [r.proposed_cents for r in PaymentReview.objects.filter(kind="over_cap", state="open")] == [6500]


# --- a watcher killed between applying a pass and saving its cursor ---------------------------

class Killed(BaseException):
    """The watcher process dies (SIGKILL): nothing after this point of the pass runs."""


def test_ltc_watcher_killed_after_applying_a_zero_conf_payment_still_judges_it_when_it_is_double_spent(
        litecoind, catalog, customer, monkeypatch):
    """The pass records a 0-conf payment that completes the order (its GPUs held for the
    monitoring window) and dies before saving its cursor. The payment is then double-spent.
    The restarted watcher still knows it was in the mempool, finds it gone with an input
    spent elsewhere, and releases the hold at once — not after the monitoring window."""
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 20200)
        watch_coin(coin="LTC")
        window_end = fresh(invoice).expires_at
        _, coin = rbf_payment(litecoind, quote.address, Decimal("0.65"))
        real_apply = payment_services.payments_apply_scan

        def apply_then_die(**kwargs):
            real_apply(**kwargs)
            raise Killed

        monkeypatch.setattr(payment_services, "payments_apply_scan", apply_then_die)
        with pytest.raises(Killed):
            watch_coin(coin="LTC")
        monkeypatch.setattr(payment_services, "payments_apply_scan", real_apply)
        assert fresh(invoice).expires_at > now + timedelta(hours=5)  # held while it confirms

        steal_back(litecoind, coin)
        watch_coin(coin="LTC")  # restarted
        litecoind.mine(1)

    payment = Payment.objects.get()
    assert (payment.state, payment.invalid_reason) == (Payment.State.INVALID, "double_spent")
    assert fresh(quote).state == Quote.State.INVALID
    assert fresh(invoice).expires_at == window_end and fresh(lease).state == LeaseState.PENDING
    assert ledger(customer) == []


# --- EVM payments after the late-payment window --------------------------------------------------

def test_eth_usdt_and_usdc_paid_long_after_the_late_window_are_recorded_for_an_operator(
        anvil, catalog, customer, operator, settings):
    """Two orders paid (ETH, USDT); 8 days later (past LATE_PAYMENT_WATCH_DAYS = 7) the old
    addresses are paid again — ETH, USDT, and USDC to the USDT quote. Each is recorded and
    waits for an operator (after_window, or misdirected); nothing is credited by itself."""
    w3, now = anvil, timezone.now()
    settings.LATE_PAYMENT_WATCH_DAYS = 7
    settings.MAX_OPEN_UNPAID_ORDERS = 3
    set_rate("ETH", "2000", now)
    CoinWallet.objects.create(coin="ETH", next_index=20300, highest_paid_index=20299)
    usdt, usdc = deploy(w3, CONTRACT, 10**15), deploy(w3, CONTRACT, 10**15)
    key, known = eth_account_key(), (usdt.address, usdc.address)
    adapters = {Coin.ETH: EvmAdapter(Coin.ETH, key, w3=w3, chain_id=31337, known_tokens=known),
                Coin.USDT: EvmAdapter(Coin.USDT, key, w3=w3, chain_id=31337, token=usdt.address, known_tokens=known),
                Coin.USDC: EvmAdapter(Coin.USDC, key, w3=w3, chain_id=31337, token=usdc.address, known_tokens=known)}
    coins = ("ETH", "USDT", "USDC")
    with coins_config.use_adapters(adapters):
        _, inv_e = order(customer, now, pay=False)
        _, inv_t = order(customer, now, pay=False)
        q_eth, q_usdt = quote_create(invoice=inv_e, coin="ETH", now=now), quote_create(invoice=inv_t, coin="USDT",
                                                                                        now=now)
        for c in coins:
            watch_coin(coin=c)
        w3.eth.send_transaction({"from": w3.eth.accounts[3], "to": q_eth.address, "value": int(q_eth.amount)})
        usdt.functions.transfer(q_usdt.address, int(q_usdt.amount)).transact({"from": w3.eth.accounts[0]})
        rpc(w3, "anvil_mine", 12)
        for c in coins:
            watch_coin(coin=c)
        assert fresh(inv_e).state == fresh(inv_t).state == Invoice.State.PAID

        later = now + timedelta(days=8)
        for c in coins:
            watch_coin(coin=c, now=later)
        again = w3.eth.send_transaction({"from": w3.eth.accounts[3], "to": q_eth.address, "value": 10**16})
        usdt.functions.transfer(q_usdt.address, 20_000_000).transact({"from": w3.eth.accounts[0]})
        usdc.functions.transfer(q_usdt.address, 5_000_000).transact({"from": w3.eth.accounts[0]})
        rpc(w3, "anvil_mine", 12)
        set_rate("ETH", "1800", later)
        for minute in (1, 2):  # one review each
            for c in coins:
                watch_coin(coin=c, now=later + timedelta(minutes=minute))

    eth = Payment.objects.get(txid=again.to_0x_hex())
    assert eth.quote_id == q_eth.pk and eth.state == Payment.State.CONFIRMED
    reviews = {(r.quote_id, r.kind, r.sent_coin or r.quote.coin): r for r in PaymentReview.objects.all()}
    assert sorted(reviews) == sorted([(q_eth.pk, "after_window", "ETH"), (q_usdt.pk, "after_window", "USDT"),
                                      (q_usdt.pk, "misdirected", "USDC")])
    assert ledger(customer) == []
    payment_review_credit(review=reviews[q_eth.pk, "after_window", "ETH"], actor=operator,
                          now=later + timedelta(minutes=3))
    payment_review_credit(review=reviews[q_usdt.pk, "after_window", "USDT"], actor=operator,
                          now=later + timedelta(minutes=3))
    assert ledger(customer) == [("late_payment", 1800), ("late_payment", 2000)]  # 0.01 ETH at $1800, 20 USDT
