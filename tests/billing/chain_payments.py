"""Helpers of the money tests on the regtest chains (the daemons are chain_daemons.py's fixtures):
the forwarder contract and its deployment, quotes paid on Litecoin, replace-by-fee payments,
the ledger and balance seen from a chain test."""
import json
from decimal import Decimal
from pathlib import Path

from billing.models import CoinWallet, LedgerEntry
from billing.payments.coins.base import Coin
from billing.payments.coins.utxo import UtxoAdapter
from billing.payments.services import quote_create
from billing.services import account_for
from tests.billing.payments_helpers import ltc_account_key, set_rate
from tests.factories import order

CONTRACT = json.loads((Path(__file__).parent / "payments" / "coins" / "contracts" / "TestUSD.json").read_text())


def ltc_quote(litecoind, customer, now, first_index):
    """An order and its LTC quote at an address no other test pays (the node is shared)."""
    set_rate("LTC", "100", now)
    CoinWallet.objects.create(coin="LTC", next_index=first_index, highest_paid_index=first_index - 1)
    lease, invoice = order(customer, now, pay=False)
    return lease, invoice, quote_create(invoice=invoice, coin="LTC", now=now)


def _confirmed_coin_over(wallet, amount):
    return next((u for u in wallet.call("listunspent", 1) if u["amount"] > amount), None)


def rbf_payment(litecoind, address, amount, fee=Decimal("0.0001")):
    """A BIP125-replaceable payment built from one explicit coin of the funding wallet:
    (txid, the coin it spends)."""
    w = litecoind.wallet
    coin = _confirmed_coin_over(w, amount + 1)
    if coin is None:   # earlier tests spent the confirmed coins: confirm their change
        litecoind.mine(1)
        coin = _confirmed_coin_over(w, amount + 1)
    change = w.call("getrawchangeaddress", "bech32")
    spend = [{"txid": coin["txid"], "vout": coin["vout"], "sequence": 0xFFFFFFFD}]
    raw = w.call("createrawtransaction", spend, {address: amount, change: coin["amount"] - amount - fee})
    return w.call("sendrawtransaction", w.call("signrawtransactionwithwallet", raw)["hex"]), coin


FORWARDER = json.loads((Path(__file__).parent / "payments" / "coins" / "contracts" / "Forwarder.json").read_text())


def deploy(w3, artifact: dict, *args):
    """A contract of the tests' artifacts (TestUSD, Forwarder) on anvil, mined."""
    tx = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"]).constructor(*args).transact(
        {"from": w3.eth.accounts[0]})
    w3.provider.make_request("anvil_mine", [1])
    return w3.eth.contract(address=w3.eth.get_transaction_receipt(tx)["contractAddress"], abi=artifact["abi"])


def ledger(customer) -> list[tuple[str, int]]:
    return [(e.kind, e.amount_cents) for e in LedgerEntry.objects.filter(account__customer=customer).order_by("pk")]


def balance(customer) -> int:
    return account_for(customer).balance_cents


def ltc(litecoind):
    return UtxoAdapter(Coin.LTC, ltc_account_key(), network="regtest", rpc=litecoind.rpc)


def steal_back(litecoind, coin):
    """The payer spends the coin the payment spent back to themselves (a double-spend)."""
    w = litecoind.wallet
    spend = [{"txid": coin["txid"], "vout": coin["vout"], "sequence": 0xFFFFFFFD}]
    raw = w.call("createrawtransaction", spend, {w.call("getnewaddress"): coin["amount"] - Decimal("0.001")})
    return w.call("sendrawtransaction", w.call("signrawtransactionwithwallet", raw)["hex"])
