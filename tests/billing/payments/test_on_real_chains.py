"""End to end on real local chains: order a lease, quote it in LTC (an ``rltc1`` address of
our derivation) or USDT (a real 6-decimal ERC-20 on anvil), pay from the node's wallet, mine,
run the watch task → the invoice is paid once and the lease is provisioning.

The chain fixtures are the session fixtures of tests/billing/chain_daemons.py (skipped
when litecoind / anvil are not installed)."""
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import CoinWallet, Invoice, LedgerEntry, Payment, Quote, WatcherCursor
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.utxo import UtxoAdapter
from billing.payments.services import quote_create
from billing.tasks import watch_payments
from rental.models import LeaseEvent, LeaseState
from tests.billing.chain_daemons import free_port
from tests.billing.chain_payments import CONTRACT, FORWARDER, deploy, ltc_quote, rbf_payment
from tests.billing.payments_helpers import eth_account_key, fresh, ltc_account_key, set_rate
from tests.factories import order


def test_ltc_order_paid_on_regtest_end_to_end(litecoind, catalog, customer):
    now = timezone.now()
    set_rate("LTC", "100", now)
    CoinWallet.objects.create(coin="LTC", next_index=5000, highest_paid_index=5000 - 1)  # clear of the adapter tests' addresses
    adapter = UtxoAdapter(Coin.LTC, ltc_account_key(), network="regtest", rpc=litecoind.rpc)
    with coins_config.use_adapters({Coin.LTC: adapter}):
        lease, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="LTC", now=now)
        assert quote.address.startswith("rltc1q") and int(quote.amount) == 65_000_000
        assert watch_payments() == {"LTC": 0}  # first pass: the watcher starts at the tip
        assert WatcherCursor.objects.get(coin="LTC").cursor["height"] == litecoind.rpc.call("getblockcount")

        txid = litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.65"))
        assert watch_payments() == {"LTC": 1}  # in the mempool: seen
        assert fresh(quote).state == Quote.State.PROCESSING and fresh(invoice).state == Invoice.State.OPEN

        litecoind.mine(5)
        watch_payments()
        assert fresh(quote).state == Quote.State.PROCESSING  # 5 of 6 confirmations
        litecoind.mine(1)
        watch_payments()
        watch_payments()  # nothing new: no double anything

    payment = Payment.objects.get()
    assert (payment.txid, int(payment.amount), payment.confirmations) == (txid, 65_000_000, 6)
    assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
    assert invoice.paid_via == "LTC"
    assert fresh(lease).state == LeaseState.PROVISIONING
    assert LeaseEvent.objects.filter(lease=lease, kind="paid").count() == 1


@pytest.fixture
def usdt_token(anvil):
    w3 = anvil
    contract = w3.eth.contract(abi=CONTRACT["abi"], bytecode=CONTRACT["bytecode"])
    tx = contract.constructor(10**15).transact({"from": w3.eth.accounts[0]})
    w3.provider.make_request("anvil_mine", [1])
    address = w3.eth.get_transaction_receipt(tx)["contractAddress"]
    return w3.eth.contract(address=address, abi=CONTRACT["abi"])


def test_usdt_order_paid_on_anvil_end_to_end(anvil, usdt_token, catalog, customer):
    w3, now = anvil, timezone.now()
    CoinWallet.objects.create(coin="ETH", next_index=5000, highest_paid_index=5000 - 1)
    adapter = EvmAdapter(Coin.USDT, eth_account_key(), w3=w3, chain_id=31337, token=usdt_token.address)
    with coins_config.use_adapters({Coin.USDT: adapter}):
        lease, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="USDT", now=now)  # pegged 1:1
        assert int(quote.amount) == 65_000_000 and f"@31337/transfer?address={quote.address}" in quote.uri
        watch_payments()
        usdt_token.functions.transfer(quote.address, 65_000_000).transact({"from": w3.eth.accounts[0]})
        w3.provider.make_request("anvil_mine", [1])
        watch_payments()
        assert fresh(quote).state == Quote.State.PROCESSING
        w3.provider.make_request("anvil_mine", [11])
        watch_payments()
    assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
    assert fresh(lease).state == LeaseState.PROVISIONING and Payment.objects.get().confirmations == 12


# --- Payments that never lose money, on the real node: RBF, double-spends, chain time, node health -------------------


def test_ltc_rbf_bump_replaces_the_payment_not_doubles_it(litecoind, catalog, customer):
    now = timezone.now()
    adapter = UtxoAdapter(Coin.LTC, ltc_account_key(), network="regtest", rpc=litecoind.rpc)
    with coins_config.use_adapters({Coin.LTC: adapter}):
        _, invoice, quote = ltc_quote(litecoind, customer, now, 6000)
        watch_payments()
        old = litecoind.wallet.call("sendtoaddress", quote.address, Decimal("0.65"), "", "", False, True)
        watch_payments()
        entry_time = litecoind.rpc.call("getmempoolentry", old)["time"]
        assert Payment.objects.get(txid=old).first_seen_at.timestamp() == entry_time  # the node's clock
        new = litecoind.wallet.call("bumpfee", old)["txid"]
        watch_payments()
        assert Payment.objects.get(txid=old).state == Payment.State.INVALID
        assert Payment.objects.get(txid=old).invalid_reason == "double_spent"
        assert Payment.objects.get(txid=new).state == Payment.State.SEEN
        assert fresh(quote).state == Quote.State.PROCESSING and int(quote.received) == 65_000_000
        litecoind.mine(6)
        watch_payments()
    assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
    assert not LedgerEntry.objects.filter(kind__in=["late_payment", "excess_payment"]).exists()


def test_ltc_double_spent_payment_invalidates_the_quote_and_releases_the_slots(
        litecoind, catalog, customer):
    now = timezone.now()
    adapter = UtxoAdapter(Coin.LTC, ltc_account_key(), network="regtest", rpc=litecoind.rpc)
    with coins_config.use_adapters({Coin.LTC: adapter}):
        lease, invoice, quote = ltc_quote(litecoind, customer, now, 6100)
        watch_payments()
        paid_tx, coin = rbf_payment(litecoind, quote.address, Decimal("0.65"))
        watch_payments()
        assert fresh(quote).state == Quote.State.PROCESSING
        assert fresh(invoice).expires_at > now + timedelta(hours=5)  # held while it confirms
        # the payer spends the same coin back to themselves with a higher fee (BIP125)
        w = litecoind.wallet
        spend = [{"txid": coin["txid"], "vout": coin["vout"], "sequence": 0xFFFFFFFD}]
        raw = w.call("createrawtransaction", spend, {w.call("getnewaddress"): coin["amount"] - Decimal("0.001")})
        thief = w.call("sendrawtransaction", w.call("signrawtransactionwithwallet", raw)["hex"])
        assert paid_tx not in litecoind.rpc.call("getrawmempool")
        watch_payments()
        payment = Payment.objects.get()
        assert (payment.state, payment.invalid_reason) == (Payment.State.INVALID, "double_spent")
        assert fresh(quote).state == Quote.State.INVALID and int(quote.received) == 0
        assert fresh(invoice).expires_at <= quote.expires_at + timedelta(minutes=1)  # the hold is released
        litecoind.mine(1)
        watch_payments()  # the conflicting transaction is mined: still invalid
        assert thief in litecoind.rpc.call("getblock", litecoind.rpc.call("getbestblockhash"))["tx"]
        assert fresh(quote).state == Quote.State.INVALID
    from ops.lifecycle import run_lifecycle

    run_lifecycle(quote.expires_at + timedelta(seconds=1))
    assert fresh(lease).state == LeaseState.CANCELLED and fresh(invoice).state == Invoice.State.EXPIRED


def test_ltc_not_offered_while_its_node_is_unreachable_or_behind(litecoind, catalog, customer, settings):
    settings.PAYMENT_NODE_MAX_TIP_AGE_MINUTES = 120
    from billing.payments.coins.utxo import CoreRpc
    from billing.payments.services import coins_offered

    key = ltc_account_key()
    dead = UtxoAdapter(Coin.LTC, key, network="regtest", rpc=CoreRpc(f"http://127.0.0.1:{free_port()}/", timeout=2))
    with coins_config.use_adapters({Coin.LTC: dead}):
        assert watch_payments()["LTC"].startswith("error: URLError")
        assert coins_offered() == []
    live = UtxoAdapter(Coin.LTC, key, network="regtest", rpc=litecoind.rpc)
    with coins_config.use_adapters({Coin.LTC: live}):
        litecoind.mine(1)
        assert watch_payments() == {"LTC": 0}
        tip = WatcherCursor.objects.get(coin="LTC").tip_time
        best = litecoind.rpc.call("getblockheader", litecoind.rpc.call("getbestblockhash"))["time"]
        assert tip.timestamp() == best
        assert coins_offered() == [Coin.LTC]
        assert coins_offered(tip + timedelta(minutes=121)) == []  # no new block for two hours: behind


def test_eth_order_paid_through_a_contract_and_a_stray_token_reported(anvil, usdt_token, catalog, customer):
    from ops.backoffice.dashboard import dashboard

    w3, now = anvil, timezone.now()
    set_rate("ETH", "2000", now)
    CoinWallet.objects.create(coin="ETH", next_index=7000, highest_paid_index=6999)
    fwd = deploy(w3, FORWARDER)
    adapter = EvmAdapter(Coin.ETH, eth_account_key(), w3=w3, chain_id=31337)  # no token configured
    with coins_config.use_adapters({Coin.ETH: adapter}):
        lease, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="ETH", now=now)
        assert int(quote.amount) == 65 * 10**18 // 2000
        watch_payments()
        fwd.functions.forward(quote.address).transact({"from": w3.eth.accounts[6], "value": int(quote.amount)})
        usdt_token.functions.transfer(quote.address, 1_000_000).transact({"from": w3.eth.accounts[0]})
        w3.provider.make_request("anvil_mine", [12])
        watch_payments()
        watch_payments()
    assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
    assert Payment.objects.get().output_index == -1 and fresh(lease).state == LeaseState.PROVISIONING
    alerts = dashboard(timezone.now()).alerts
    assert any("token we do not take" in a for a in alerts), alerts


def test_ltc_payment_reorged_out_and_double_spent_after_settlement(litecoind, catalog, customer, settings):
    """Speed policy: a $65 order settles on one confirmation. That block is then orphaned
    and the payer double-spends the coin: the invoice is flagged, the invoice and the
    overpayment credit taken back, and an operator review opened."""
    from billing.models import PaymentReview

    settings.PAYMENT_SPEED_POLICY = "10000:1"
    now = timezone.now()
    adapter = UtxoAdapter(Coin.LTC, ltc_account_key(), network="regtest", rpc=litecoind.rpc)
    with coins_config.use_adapters({Coin.LTC: adapter}):
        _, invoice, quote = ltc_quote(litecoind, customer, now, 6200)
        watch_payments()
        _, coin = rbf_payment(litecoind, quote.address, Decimal("0.75"))  # $75 for $65: $10 over
        (block,) = litecoind.mine(1)
        watch_payments()
        assert fresh(quote).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
        assert LedgerEntry.objects.get(kind="excess_payment").amount_cents == 1000

        litecoind.rpc.call("invalidateblock", block)  # the block is orphaned ...
        w = litecoind.wallet
        spend = [{"txid": coin["txid"], "vout": coin["vout"], "sequence": 0xFFFFFFFD}]
        raw = w.call("createrawtransaction", spend, {w.call("getnewaddress"): coin["amount"] - Decimal("0.001")})
        w.call("sendrawtransaction", w.call("signrawtransactionwithwallet", raw)["hex"])  # ... and double-spent
        litecoind.mine(2, fresh=True)
        watch_payments()
        watch_payments()

    payment = Payment.objects.get()
    assert payment.state == Payment.State.REORGED
    assert fresh(invoice).flag == "payment_reversed"
    # The invoice it paid and the $10 credit are taken back in full: a debt
    assert LedgerEntry.objects.get(kind="clawback").amount_cents == -7500
    review = PaymentReview.objects.get()
    assert (review.kind, review.state, review.clawed_back_cents) == ("reversed", "open", 7500)
