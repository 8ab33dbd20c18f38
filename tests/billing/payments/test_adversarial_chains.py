"""Money on real local chains (litecoind regtest, anvil, monerod regtest with a view-only
wallet): no double credit after a reorg,
no lost claw-back, on-time payments win over the sweeps after a watcher outage, no stock
held by dust or by payments that never confirm, misdirected coins reported. Each test
asserts the ledger, the balance, the invoice and the lease afterwards.

The chain fixtures are the session fixtures of tests/billing/chain_daemons.py (a missing
litecoind / anvil skips locally and fails under CI=true)."""
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import CoinWallet, Invoice, Payment, PaymentReview, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.monero import MoneroAdapter
from billing.payments.services import quote_create, watch_coin
from billing.services import topup_invoice_create
from billing.tasks import watch_payments
from ops.lifecycle import run_lifecycle
from rental.agent import Instance
from rental.models import LeaseState, Notification
from rental.services import lease_provisioned
from tests.billing.chain_payments import (
    CONTRACT,
    FORWARDER,
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


def activate(lease, now):
    lease_provisioned(lease_id=lease.pk, instance=Instance("10.0.0.7", 2207), now=now)
    assert fresh(lease).state == LeaseState.ACTIVE


# --- double credit -------------------------------------------------------------------------

def test_ltc_settled_then_reorged_then_fee_bumped_is_one_payment_one_credit(
        litecoind, catalog, customer, settings):
    """The block that settled the order is orphaned, the payment is back in the mempool and
    the wallet bumps its fee (same outputs, new txid): the bump pays the invoice in the
    reversed payment's place — it is no "excess" credit on top of a paid invoice."""
    settings.PAYMENT_SPEED_POLICY = "10000:1"  # a $65 order settles on one confirmation
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8000)
        watch_payments()
        old = litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.65"), "", "", False, True)
        (block,) = litecoind.mine(1)
        watch_payments()
        assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
        assert fresh(lease).state == LeaseState.PROVISIONING and ledger(customer) == []

        litecoind.rpc.call("invalidateblock", block)  # orphaned: the payment is back in the mempool
        watch_payments()
        assert ledger(customer) == []  # still on its way: nothing taken back yet
        new = litecoind.wallet.call("bumpfee", old)["txid"]
        watch_payments()
        assert Payment.objects.get(txid=old).state == Payment.State.INVALID
        assert ledger(customer) == [("clawback", -6500)] and balance(customer) == -6500  # owed meanwhile
        assert fresh(invoice).flag == "payment_reversed"
        litecoind.mine(1, fresh=True)
        watch_payments()
        watch_payments()

    bump = Payment.objects.get(txid=new)
    assert bump.state == Payment.State.CONFIRMED and bump.in_settlement and bump.credited_cents is None
    assert ledger(customer) == [("clawback", -6500), ("restored", 6500)] and balance(customer) == 0
    invoice.refresh_from_db()
    assert (invoice.state, invoice.flag) == (Invoice.State.PAID, "payment_recovered")
    assert fresh(lease).state == LeaseState.PROVISIONING
    assert not PaymentReview.objects.filter(state=PaymentReview.State.OPEN).exists()  # given back: closed


def test_eth_contract_payment_re_mined_after_a_reorg_is_the_same_payment(
        anvil, catalog, customer):
    """ETH forwarded by a contract (an internal transfer) is identified by its transaction
    hash: re-mined in another block after a reorg it is the same payment, credited once;
    left out of the new chain it is taken back, and given back when it is mined again."""
    w3, now = anvil, timezone.now()
    set_rate("ETH", "2000", now)
    CoinWallet.objects.create(coin="ETH", next_index=9000, highest_paid_index=8999)
    fwd = deploy(w3, FORWARDER)
    with coins_config.use_adapters({Coin.ETH: EvmAdapter(Coin.ETH, eth_account_key(), w3=w3, chain_id=31337)}):
        lease, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="ETH", now=now)
        watch_payments()
        sent = fwd.functions.forward(quote.address).transact({"from": w3.eth.accounts[6], "value": int(quote.amount)})
        raw = w3.provider.make_request("eth_getRawTransactionByHash", ["0x" + sent.hex().removeprefix("0x")])["result"]
        w3.provider.make_request("anvil_mine", [12])
        watch_payments()
        payment = Payment.objects.get()
        assert payment.txid == "0x" + sent.hex().removeprefix("0x") and payment.output_index == -1
        assert fresh(invoice).state == Invoice.State.PAID
        first_block = payment.block_hash

        w3.provider.make_request("anvil_reorg", [12, [[raw, 0]]])  # 12 new blocks, the same tx in the first
        watch_payments()
        watch_payments()
        payment = Payment.objects.get()  # still one
        assert payment.block_hash != first_block and payment.state == Payment.State.CONFIRMED
        assert ledger(customer) == [] and fresh(invoice).flag == ""

        w3.provider.make_request("anvil_reorg", [12, []])  # now a chain without it
        watch_payments()
        assert Payment.objects.get().state == Payment.State.REORGED
        assert ledger(customer) == [("clawback", -6500)] and fresh(invoice).flag == "payment_reversed"
        pool = w3.provider.make_request("eth_sendRawTransaction", [raw])  # the payer's wallet re-broadcasts
        assert "result" in pool or "already" in str(pool.get("error", "")).lower(), pool
        w3.provider.make_request("anvil_mine", [12])
        watch_payments()
        watch_payments()

    assert Payment.objects.count() == 1 and Payment.objects.get().state == Payment.State.CONFIRMED
    assert ledger(customer) == [("clawback", -6500), ("restored", 6500)] and balance(customer) == 0
    assert fresh(invoice).state == Invoice.State.PAID and fresh(lease).state == LeaseState.PROVISIONING


# --- claw-back -----------------------------------------------------------------------------------

def test_ltc_double_spent_after_settlement_suspends_the_lease_until_a_top_up_on_chain_pays_the_debt(
        litecoind, catalog, customer, settings):
    settings.PAYMENT_SPEED_POLICY = "10000:1"
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 0
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8100)
        watch_payments()
        _, coin = rbf_payment(litecoind, quote.address, Decimal("0.75"))  # $75 for $65: $10 credited
        (block,) = litecoind.mine(1)
        watch_payments()
        activate(lease, timezone.now())
        assert ledger(customer) == [("excess_payment", 1000)]

        litecoind.rpc.call("invalidateblock", block)
        steal_back(litecoind, coin)
        litecoind.mine(2, fresh=True)
        watch_payments()
        watch_payments()
        assert ledger(customer) == [("excess_payment", 1000), ("clawback", -7500)] and balance(customer) == -6500
        review = PaymentReview.objects.get()
        assert (review.kind, review.state, review.clawed_back_cents) == ("reversed", "open", 7500)
        run_lifecycle(timezone.now())
        assert fresh(lease).state == LeaseState.SUSPENDED  # no grace configured: at once
        notice = Notification.objects.get(lease=lease, kind="suspended")  # why, and what resumes it
        assert "left its chain after it counted" in notice.body and "ended unpaid" not in notice.body

        set_rate("LTC", "100", timezone.now())
        topup = topup_invoice_create(customer=customer, amount_cents=6500, now=timezone.now())
        tq = quote_create(invoice=topup, coin="LTC", now=timezone.now())
        litecoind.wallet.call("sendtoaddress", tq.address, Decimal("0.65"))
        litecoind.mine(1)
        watch_payments()
        run_lifecycle(timezone.now())

    assert ledger(customer) == [("excess_payment", 1000), ("clawback", -7500), ("topup", 6500)]
    assert balance(customer) == 0
    assert fresh(invoice).flag == "payment_recovered" and fresh(lease).state == LeaseState.ACTIVE


def test_xmr_settled_then_gone_in_a_reorg_deeper_than_its_confirmations_is_reversed(
        monero_regtest, catalog, customer, settings):
    """Monero: settled at 10 confirmations and the lease running, then an 11-block reorg whose
    chain lacks the payment (gone from the daemon and the view-only wallet). The watcher still
    looks for settled payments (XMR_SETTLED_WATCH_BLOCKS), so the settlement is reversed the
    way every coin's is: taken back, the invoice flagged, a review for the operators, and the
    lease suspended once the grace has passed with the debt unpaid."""
    settings.PAYMENT_REVERSAL_GRACE_MINUTES = 0
    net, now = monero_regtest, timezone.now()
    set_rate("XMR", "150", now)
    with coins_config.use_adapters({Coin.XMR: MoneroAdapter(net.merchant)}):
        lease, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="XMR", now=now)
        watch_coin(coin="XMR")
        sent = net.pay(quote.address, int(quote.amount))
        net.mine_until_deep(sent["tx_hash"], 10)
        watch_coin(coin="XMR")
        assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
        activate(lease, timezone.now())
        net.mine(1)
        watch_coin(coin="XMR")  # settled: nothing changes while it stays on the chain
        assert ledger(customer) == [] and Payment.objects.get().state == Payment.State.CONFIRMED

        try:
            net.reorg(11, without=[sent["tx_hash"]])
            watch_coin(coin="XMR")
            watch_coin(coin="XMR")  # reported once, taken back once
        finally:  # the funder's spend left the chain: the next test must not build on it
            net.forget_dropped_spends()
        run_lifecycle(timezone.now())

    assert Payment.objects.get().state == Payment.State.REORGED
    assert ledger(customer) == [("clawback", -6500)] and balance(customer) == -6500
    review = PaymentReview.objects.get()
    assert (review.kind, review.state, review.clawed_back_cents) == ("reversed", "open", 6500)
    assert fresh(invoice).flag == "payment_reversed" and fresh(lease).state == LeaseState.SUSPENDED


# --- watcher downtime ---------------------------------------------------------------------------

def test_ltc_payment_on_time_by_the_chain_wins_over_the_sweep_after_a_watcher_outage(
        litecoind, catalog, customer, settings):
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8200)
        watch_payments()  # the watcher is up ... then down for hours
        litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.65"))
        litecoind.mine(6)
        later = quote.expires_at + timedelta(hours=2)
        run_lifecycle(later)  # the sweep runs first: the watcher has not scanned past the deadline
        assert fresh(invoice).state == Invoice.State.OPEN and fresh(lease).state == LeaseState.PENDING
        assert fresh(quote).state == Quote.State.NEW
        # the other order, paid during the same outage: no sweep ran for it before the watcher
        # is back (the watcher first, then the sweep)
        lease2, invoice2 = order(customer, now, pay=False, offer="rtx-3090")
        quote2 = quote_create(invoice=invoice2, coin="LTC", now=now)
        litecoind.wallet.call("sendtoaddress", quote2.address, Decimal("0.65"))
        litecoind.mine(6)
        watch_coin(coin="LTC", now=later)  # back: the chain dates the payments on time
        run_lifecycle(later + timedelta(minutes=1))

        assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
        assert fresh(lease).state == LeaseState.PROVISIONING and ledger(customer) == []
        assert fresh(invoice2).state == Invoice.State.PAID and fresh(lease2).state == LeaseState.PROVISIONING


def test_an_order_waits_for_a_dead_watcher_only_so_long(litecoind, catalog, customer, settings):
    settings.PAYMENT_WATCHER_LAG_MAX_MINUTES = 60
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8300)
        watch_payments()
        run_lifecycle(invoice.expires_at + timedelta(minutes=59))
        assert fresh(lease).state == LeaseState.PENDING
        run_lifecycle(invoice.expires_at + timedelta(minutes=61))
    assert fresh(lease).state == LeaseState.CANCELLED and fresh(invoice).state == Invoice.State.EXPIRED


# --- holding stock ---------------------------------------------------------------------------------

def test_ltc_partial_payments_extend_the_hold_once_and_dust_never(litecoind, catalog, customer):
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8400)
        watch_payments()
        window_end = fresh(invoice).expires_at
        dust = litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.001"))
        watch_payments()
        assert fresh(invoice).expires_at == window_end  # dust: no extension
        first = litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.1"))
        watch_payments()
        litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.1"))
        watch_payments()
        litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.1"))
        watch_payments()
    extended = Payment.objects.get(txid=first).first_seen_at + coins_config.quote_window()
    assert fresh(quote).expires_at == fresh(invoice).expires_at == max(extended, window_end)
    assert Payment.objects.get(txid=dust).state == Payment.State.SEEN


def test_ltc_unconfirmed_past_the_monitoring_window_releases_the_stock(litecoind, catalog, customer):
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8500)
        watch_payments()
        litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.65"))
        watch_payments()
        assert fresh(invoice).expires_at > now + timedelta(hours=5)  # held while it confirms
        later = now + coins_config.monitoring_window() + timedelta(minutes=1)
        watch_coin(coin="LTC", now=later)  # never mined in six hours
        run_lifecycle(later)
    payment = Payment.objects.get()
    assert (payment.state, payment.invalid_reason) == (Payment.State.INVALID, "unconfirmed_too_long")
    assert fresh(lease).state == LeaseState.CANCELLED and fresh(invoice).state == Invoice.State.EXPIRED
    assert ledger(customer) == []
    litecoind.mine(1)  # leave the shared node's mempool clean


def test_ltc_double_spent_order_falls_back_to_the_accounts_own_window(litecoind, catalog, customer, settings):
    settings.PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES = 15  # a customer who never paid: 15, not 30
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8600)
        assert fresh(invoice).expires_at == lease.pay_by == now + timedelta(minutes=15)
        watch_payments()
        _, coin = rbf_payment(litecoind, quote.address, Decimal("0.65"))
        watch_payments()
        assert fresh(invoice).expires_at > now + timedelta(hours=5)
        steal_back(litecoind, coin)
        watch_payments()
        assert fresh(quote).state == Quote.State.INVALID
        assert fresh(invoice).expires_at == now + timedelta(minutes=15)
        watch_coin(coin="LTC", now=now + timedelta(minutes=16))  # the sweep waits for a pass past the deadline
        run_lifecycle(now + timedelta(minutes=16))
    assert fresh(lease).state == LeaseState.CANCELLED and ledger(customer) == []
    litecoind.mine(1)


# --- misdirected coins ------------------------------------------------------------------------------

def test_usdc_to_a_usdt_quote_eth_to_a_token_quote_and_a_token_to_an_eth_quote_are_reported(
        anvil, catalog, customer, operator, settings):
    from billing.payments.credits import payment_review_close, payment_review_credit
    from ops.backoffice.dashboard import dashboard

    w3, now = anvil, timezone.now()
    settings.MAX_OPEN_UNPAID_ORDERS = 3
    set_rate("ETH", "2000", now)
    CoinWallet.objects.create(coin="ETH", next_index=9100, highest_paid_index=9099)
    usdt, usdc = deploy(w3, CONTRACT, 10**15), deploy(w3, CONTRACT, 10**15)
    key = eth_account_key()
    known = (usdt.address, usdc.address)
    adapters = {Coin.ETH: EvmAdapter(Coin.ETH, key, w3=w3, chain_id=31337, known_tokens=known),
                Coin.USDT: EvmAdapter(Coin.USDT, key, w3=w3, chain_id=31337, token=usdt.address, known_tokens=known),
                Coin.USDC: EvmAdapter(Coin.USDC, key, w3=w3, chain_id=31337, token=usdc.address, known_tokens=known)}
    with coins_config.use_adapters(adapters):
        _, inv_t = order(customer, now, pay=False)
        _, inv_e = order(customer, now, pay=False)
        q_usdt = quote_create(invoice=inv_t, coin="USDT", now=now)
        q_eth = quote_create(invoice=inv_e, coin="ETH", now=now)
        watch_payments()
        usdc.functions.transfer(q_usdt.address, 65_000_000).transact({"from": w3.eth.accounts[0]})
        w3.eth.send_transaction({"from": w3.eth.accounts[7], "to": q_usdt.address, "value": 10**16})
        usdt.functions.transfer(q_eth.address, 5_000_000).transact({"from": w3.eth.accounts[0]})
        w3.provider.make_request("anvil_mine", [12])
        watch_payments()
        watch_payments()  # reported once

    reviews = {r.sent_coin: r for r in PaymentReview.objects.filter(kind="misdirected")}
    assert sorted(reviews) == ["ETH", "USDC", "USDT"]
    assert (reviews["USDC"].quote, int(reviews["USDC"].amount), reviews["USDC"].proposed_cents) == (
        q_usdt, 65_000_000, 6500)
    assert (reviews["ETH"].quote, reviews["ETH"].proposed_cents) == (q_usdt, 2000)  # 0.01 ETH at $2000
    assert (reviews["USDT"].quote, reviews["USDT"].proposed_cents) == (q_eth, 500)
    assert not Payment.objects.exists() and fresh(inv_t).state == fresh(inv_e).state == Invoice.State.OPEN
    assert any("review" in a for a in dashboard(timezone.now()).alerts)
    payment_review_credit(review=reviews["USDC"], actor=operator, now=timezone.now())  # one click: credited
    payment_review_close(review=reviews["ETH"], actor=operator, now=timezone.now(), note="refunded on chain")
    assert ledger(customer) == [("late_payment", 6500)] and balance(customer) == 6500


# --- after a reversal -------------------------------------------------------------------------

def test_ltc_repayment_larger_than_the_invoice_after_a_reversal_credits_the_excess(
        litecoind, catalog, customer, settings):
    """The settling payment is double-spent after it counted ($65 taken back), and the customer
    pays the same address again, $130 this time: it fills the settlement in the reversed one's
    place — the $65 taken is given back and the other $65 is the customer's, on the balance
    (not silently kept by the store)."""
    settings.PAYMENT_SPEED_POLICY = "10000:1"
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8700)
        watch_payments()
        _, coin = rbf_payment(litecoind, quote.address, Decimal("0.65"))
        (block,) = litecoind.mine(1)
        watch_payments()
        assert fresh(invoice).state == Invoice.State.PAID and ledger(customer) == []

        litecoind.rpc.call("invalidateblock", block)
        steal_back(litecoind, coin)
        litecoind.mine(2, fresh=True)
        watch_payments()
        assert ledger(customer) == [("clawback", -6500)] and fresh(invoice).flag == "payment_reversed"

        litecoind.wallet.call("sendtoaddress", quote.address, Decimal("1.30"))
        litecoind.mine(1)
        watch_payments()
        watch_payments()  # credited once

    assert ledger(customer) == [("clawback", -6500), ("restored", 6500), ("excess_payment", 6500)]
    assert balance(customer) == 6500 and fresh(invoice).flag == "payment_recovered"
    assert not PaymentReview.objects.filter(state=PaymentReview.State.OPEN).exists()


def test_ltc_repayment_excess_over_the_automatic_cap_after_a_reversal_waits_for_an_operator(
        litecoind, catalog, customer, settings):
    settings.PAYMENT_SPEED_POLICY = "10000:1"
    settings.PAYMENT_AUTO_CREDIT_MAX_PERCENT = 50  # $32.50 of a $65 quote credited by itself
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8800)
        watch_payments()
        _, coin = rbf_payment(litecoind, quote.address, Decimal("0.65"))
        (block,) = litecoind.mine(1)
        watch_payments()
        litecoind.rpc.call("invalidateblock", block)
        steal_back(litecoind, coin)
        litecoind.mine(2, fresh=True)
        watch_payments()
        litecoind.wallet.call("sendtoaddress", quote.address, Decimal("1.30"))
        litecoind.mine(1)
        watch_payments()
        watch_payments()  # held once

    assert ledger(customer) == [("clawback", -6500), ("restored", 6500)] and balance(customer) == 0
    review = PaymentReview.objects.get(state=PaymentReview.State.OPEN)
    assert (review.kind, review.proposed_cents, int(review.amount), review.quote_id) == (
        "over_cap", 6500, 65_000_000, quote.pk)


# --- a restored wallet ------------------------------------------------------------------------------

def _restore_merchant_wallet(net, name):
    """The operator restores the view-only wallet from its address and view key: a new wallet
    file that counts its subaddresses from 1 again."""
    address = net.merchant.call("get_address", account_index=0)["address"]
    view = net.merchant.call("query_key", key_type="view_key")["key"]
    net.merchant.call("close_wallet")
    net.merchant.call("generate_from_keys", filename=name, address=address, viewkey=view, password="",
                      restore_height=0)


def test_xmr_quotes_after_the_wallet_is_restored_from_its_keys_get_new_subaddresses(
        monero_regtest, catalog, customer, settings):
    """Quotes were issued, then the view-only wallet is restored from its keys: the next quotes
    get subaddresses past every quote's (no IntegrityError on the quote's address, no old
    quote's address handed out again), and a payment to one settles its order."""
    import uuid

    net, now = monero_regtest, timezone.now()
    settings.ADDRESSES_UNPAID_PER_CUSTOMER = 10
    settings.MAX_OPEN_UNPAID_ORDERS = 10
    set_rate("XMR", "150", now)
    issued = len(net.merchant.call("get_address", account_index=0)["addresses"]) - 1  # every test's so far
    tag = uuid.uuid4().hex[:8]
    _restore_merchant_wallet(net, f"merchant-a-{tag}")  # counts from 1: as the store's first wallet did
    try:
        with coins_config.use_adapters({Coin.XMR: MoneroAdapter(net.merchant)}):
            before = [quote_create(invoice=order(customer, now, pay=False)[1], coin="XMR", now=now)
                      for _ in range(3)]
            assert [q.derivation_index for q in before] == [1, 2, 3]
            _restore_merchant_wallet(net, f"merchant-b-{tag}")
            lease, invoice = order(customer, now, pay=False)
            after = [quote_create(invoice=invoice, coin="XMR", now=now)]
            after.append(quote_create(invoice=order(customer, now, pay=False)[1], coin="XMR", now=now))
            assert [q.derivation_index for q in after] == [4, 5]
            assert len({q.address for q in before + after}) == 5
            assert net.merchant.call("get_address_index", address=after[0].address)["index"]["minor"] == 4

            sent = net.pay(after[0].address, int(after[0].amount))
            net.mine_until_deep(sent["tx_hash"], 10)
            watch_coin(coin="XMR")
        assert fresh(after[0]).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
    finally:  # the session's wallet must not hand out subaddresses other tests were paid to
        have = len(net.merchant.call("get_address", account_index=0)["addresses"]) - 1
        if have < issued + 5:
            net.merchant.call("create_address", account_index=0, count=issued + 5 - have)


# --- a miner's clock ---------------------------------------------------------------------------------

def test_ltc_payment_in_a_block_dated_before_the_expiry_but_first_seen_after_it_is_late(
        litecoind, catalog, customer, settings):
    """The watcher caught up with the chain 10 minutes after the quote expired, and the payment
    was not there. Then a miner's block carries it (straight into the block, never in the
    store's mempool) with a time before the expiry. It was first seen after the expiry: late,
    credited at the rate when it confirmed (half the quoted one), and the order is not paid
    at the old rate."""
    settings.PAYMENT_SPEED_POLICY = "10000:1"
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 8900)
        after = quote.expires_at + timedelta(minutes=10)
        set_rate("LTC", "50", after)  # the rate halved meanwhile
        watch_coin(coin="LTC", now=after)  # caught up: no payment yet
        w = litecoind.wallet
        raw = w.call("createrawtransaction", [], {quote.address: Decimal("0.65")})
        funded = w.call("fundrawtransaction", raw)["hex"]
        signed = w.call("signrawtransactionwithwallet", funded)["hex"]
        block = litecoind.rpc.call("generateblock", litecoind.mine_to, [signed])["hash"]
        block_time = litecoind.rpc.call("getblockheader", block)["time"]
        assert block_time < quote.expires_at.timestamp()  # the block says: on time
        watch_coin(coin="LTC", now=after + timedelta(minutes=1))

    payment = Payment.objects.get()
    assert payment.first_seen_at == after.replace(microsecond=0) and payment.state == Payment.State.CONFIRMED
    assert (fresh(quote).state, fresh(quote).exception) == (Quote.State.EXPIRED, Quote.Exception_.LATE)
    assert fresh(invoice).state == Invoice.State.OPEN
    assert ledger(customer) == [("late_payment", 3250)]  # 0.65 LTC at $50, not $65 at $100


# --- after the late-payment window -------------------------------------------------------------------

def test_ltc_payment_to_a_quote_long_after_its_late_window_is_recorded_for_an_operator(
        litecoind, catalog, customer, operator, settings):
    """The order was paid; 8 days later (past LATE_PAYMENT_WATCH_DAYS = 7) the customer's wallet
    pays the old address again. The watcher still sees it: the payment is recorded and a
    review waits for an operator (credited at that day's rate by one click); nothing is
    credited by itself."""
    from billing.payments.credits import payment_review_credit

    settings.PAYMENT_SPEED_POLICY = "10000:1"
    settings.LATE_PAYMENT_WATCH_DAYS = 7
    now = timezone.now()
    with coins_config.use_adapters({Coin.LTC: ltc(litecoind)}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 9000)
        watch_payments()
        litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.65"))
        litecoind.mine(1)
        watch_payments()
        assert fresh(invoice).state == Invoice.State.PAID
        later = now + timedelta(days=8)
        watch_coin(coin="LTC", now=later)
        again = litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.20"))
        litecoind.mine(1)
        set_rate("LTC", "90", later)
        watch_coin(coin="LTC", now=later + timedelta(minutes=1))
        watch_coin(coin="LTC", now=later + timedelta(minutes=2))  # one review

    payment = Payment.objects.get(txid=again)
    assert payment.state == Payment.State.CONFIRMED and payment.quote_id == quote.pk
    review = PaymentReview.objects.get()
    assert (review.kind, review.state, review.payment_id, review.proposed_cents) == (
        "after_window", "open", payment.pk, None)
    assert ledger(customer) == []
    payment_review_credit(review=review, actor=operator, now=later + timedelta(minutes=3))
    assert ledger(customer) == [("late_payment", 1800)]  # 0.20 LTC at $90
