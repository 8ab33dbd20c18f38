"""End to end on real local chains: order a lease, quote it in LTC (an ``rltc1`` address of
our derivation) or USDT (a real 6-decimal ERC-20 on anvil), pay from the node's wallet, mine,
run the watch task → the invoice is paid once and the lease is provisioning.

The chain fixtures are the session fixtures of tests/billing/coins/conftest.py (skipped
when litecoind / anvil are not installed)."""
import json
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from billing.models import CoinWallet, Invoice, Payment, Quote, WatcherCursor
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.utxo import UtxoAdapter
from billing.payments.services import quote_create
from billing.tasks import watch_payments
from rental.models import LeaseEvent, LeaseState
from tests.billing.coins.conftest import anvil, litecoind  # noqa: F401 - session fixtures
from tests.billing.payments_helpers import eth_account_key, fresh, ltc_account_key, set_rate
from tests.billing.test_lifecycle import order

CONTRACT = json.loads((Path(__file__).parent / "coins" / "contracts" / "TestUSD.json").read_text())


def test_ltc_order_paid_on_regtest_end_to_end(litecoind, catalog, customer):  # noqa: F811
    now = timezone.now()
    set_rate("LTC", "100", now)
    CoinWallet.objects.create(coin="LTC", next_index=5000)  # clear of the adapter tests' addresses
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
def usdt_token(anvil):  # noqa: F811
    w3 = anvil
    contract = w3.eth.contract(abi=CONTRACT["abi"], bytecode=CONTRACT["bytecode"])
    tx = contract.constructor(10**15).transact({"from": w3.eth.accounts[0]})
    w3.provider.make_request("anvil_mine", [1])
    address = w3.eth.get_transaction_receipt(tx)["contractAddress"]
    return w3.eth.contract(address=address, abi=CONTRACT["abi"])


def test_usdt_order_paid_on_anvil_end_to_end(anvil, usdt_token, catalog, customer):  # noqa: F811
    w3, now = anvil, timezone.now()
    CoinWallet.objects.create(coin="ETH", next_index=5000)
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
