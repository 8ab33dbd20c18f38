"""ETH and a real 6-decimal ERC-20 on a real local chain (anvil, started with --no-mining so
the tests mine explicitly). Reorgs via ``anvil_reorg``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bip_utils import Bip39SeedGenerator, Bip44, Bip44Coins

from billing.payments.coins.base import Coin
from billing.payments.coins.evm import EvmAdapter
from tests.billing.chain_daemons import TEST_MNEMONIC

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "TestUSD.json").read_text())
_counter = iter(range(10_000))


def eth_account_xpub() -> str:
    seed = Bip39SeedGenerator(TEST_MNEMONIC).Generate()
    return Bip44.FromSeed(seed, Bip44Coins.ETHEREUM).Purpose().Coin().Account(0).PublicKey().ToExtended()


def mine(w3, n=1):
    w3.provider.make_request("anvil_mine", [n])


def tip_cursor(w3):
    return {"height": w3.eth.block_number}


@pytest.fixture(scope="module")
def token(anvil):
    w3 = anvil
    c = w3.eth.contract(abi=CONTRACT["abi"], bytecode=CONTRACT["bytecode"])
    txh = c.constructor(10**15).transact({"from": w3.eth.accounts[0]})
    mine(w3)
    addr = w3.eth.get_transaction_receipt(txh)["contractAddress"]
    tok = w3.eth.contract(address=addr, abi=CONTRACT["abi"])
    assert tok.functions.decimals().call() == 6
    return tok


def eth(anvil, **kw):
    return EvmAdapter(Coin.ETH, eth_account_xpub(), w3=anvil, chain_id=31337, **kw)


def usdc(anvil, token, **kw):
    return EvmAdapter(Coin.USDC, eth_account_xpub(), w3=anvil, chain_id=31337, token=token.address, **kw)


def test_derivation_is_the_standard_first_account(anvil):
    # m/44'/60'/0'/0/0 of the test mnemonic: the well-known first account of that seed
    assert eth(anvil).address_for_index(0) == "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"


def test_eth_payment_confirmations(anvil):
    w3 = anvil
    a = eth(w3)
    addr = a.address_for_index(100 + next(_counter))
    cursor = tip_cursor(w3)
    txh = w3.eth.send_transaction({"from": w3.eth.accounts[1], "to": addr, "value": 123 * 10**15})
    mine(w3)
    r = a.scan({addr}, cursor)
    (p,) = r.payments
    assert (p.txid, p.output_index, p.address, p.amount, p.confirmations) == (
        "0x" + txh.hex().removeprefix("0x"), 0, addr, 123 * 10**15, 1)
    mine(w3, 11)
    r = a.scan({addr}, r.cursor)
    assert [q.confirmations for q in r.payments] == [12]
    mine(w3)
    r2 = a.scan({addr}, r.cursor)
    assert r2.payments == []
    # the documented fallback: balance at the confirmed block
    assert a.confirmed_balance(addr) == 123 * 10**15


def test_token_payments_by_transfer_logs(anvil, token):
    w3 = anvil
    a = usdc(w3, token)
    x, y = (a.address_for_index(200 + next(_counter)) for _ in range(2))
    cursor = tip_cursor(w3)
    payer = w3.eth.accounts[0]
    token.functions.batchTransfer([x, y, x], [5_000_000, 7_000_000, 1_500_000]).transact({"from": payer})
    token.functions.transfer(w3.eth.accounts[2], 1).transact({"from": payer})  # not watched
    mine(w3)
    r = a.scan({x: "quote-x", y: "quote-y"}, cursor)
    got = sorted((p.address, p.amount, p.output_index) for p in r.payments)
    assert [(g[0], g[1]) for g in got] == sorted([(x, 5_000_000), (y, 7_000_000), (x, 1_500_000)])
    assert len({p.key for p in r.payments}) == 3  # same tx, distinct log indexes
    assert all(p.confirmations == 1 for p in r.payments)
    mine(w3, 11)
    assert a.confirmed_balance(x) == 6_500_000
    # the ETH watcher does not take token transfers for ETH
    assert eth(w3).scan({x, y}, cursor).payments == []


def test_token_uri_and_eth_uri(anvil, token):
    a, e = usdc(anvil, token), eth(anvil)
    to = a.address_for_index(0)
    assert a.payment_uri(to, 2_500_000) == (
        f"ethereum:{token.address}@31337/transfer?address={to}&uint256=2500000")
    assert e.payment_uri(to, 10**18) == f"ethereum:{to}@31337?value=1000000000000000000"


def test_reorg_before_settlement(anvil, token):
    w3 = anvil
    a, t = eth(w3), usdc(w3, token)
    addr = a.address_for_index(300 + next(_counter))
    cursor = tip_cursor(w3)
    w3.eth.send_transaction({"from": w3.eth.accounts[3], "to": addr, "value": 10**18})
    token.functions.transfer(addr, 42_000_000).transact({"from": w3.eth.accounts[0]})
    mine(w3)
    mine(w3, 2)
    r_eth, r_tok = a.scan({addr}, cursor), t.scan({addr}, cursor)
    assert [p.confirmations for p in r_eth.payments] == [3]
    assert [p.amount for p in r_tok.payments] == [42_000_000]
    orphan = r_eth.payments[0].block_hash

    w3.provider.make_request("anvil_reorg", [3, []])  # replace the last 3 blocks, without our txs
    assert w3.eth.get_block(r_eth.payments[0].block_height)["hash"].hex() not in orphan
    r_eth2, r_tok2 = a.scan({addr}, r_eth.cursor), t.scan({addr}, r_tok.cursor)
    assert r_eth2.reorged == [r_eth.payments[0].key] and r_eth2.payments == []
    assert r_tok2.reorged == [r_tok.payments[0].key] and r_tok2.payments == []


FORWARDER = json.loads((Path(__file__).parent / "contracts" / "Forwarder.json").read_text())


@pytest.fixture(scope="module")
def forwarder(anvil):
    c = anvil.eth.contract(abi=FORWARDER["abi"], bytecode=FORWARDER["bytecode"])
    txh = c.constructor().transact({"from": anvil.eth.accounts[0]})
    mine(anvil)
    return anvil.eth.contract(address=anvil.eth.get_transaction_receipt(txh)["contractAddress"],
                              abi=FORWARDER["abi"])


def test_eth_sent_by_a_contract_is_seen_by_the_balance_change(anvil, forwarder):
    w3 = anvil
    a = eth(w3)
    addr = a.address_for_index(400 + next(_counter))
    cursor = tip_cursor(w3)
    forwarded = forwarder.functions.forward(addr).transact({"from": w3.eth.accounts[4], "value": 7 * 10**17})
    w3.eth.send_transaction({"from": w3.eth.accounts[5], "to": addr, "value": 10**17})  # and a direct one
    mine(w3)
    r = a.scan({addr}, cursor)
    block = w3.eth.get_block(w3.eth.block_number)
    # The contract's payment is identified by its transaction (traced), so the same
    # transaction re-mined after a reorg is the same payment.
    contract_tx = "0x" + forwarded.hex().removeprefix("0x")
    assert sorted((p.txid == contract_tx, p.output_index, p.amount) for p in r.payments) == [
        (False, 0, 10**17), (True, -1, 7 * 10**17)]  # each counted once
    assert all(p.chain_time == block["timestamp"] for p in r.payments)
    mine(w3)
    assert [p.confirmations for p in a.scan({addr}, r.cursor).payments] == [2, 2]


def test_deposits_of_an_unconfigured_token_are_reported(anvil, token):
    w3 = anvil
    other = w3.eth.contract(abi=CONTRACT["abi"], bytecode=CONTRACT["bytecode"])
    txh = other.constructor(10**12).transact({"from": w3.eth.accounts[0]})
    mine(w3)
    stray = w3.eth.contract(address=w3.eth.get_transaction_receipt(txh)["contractAddress"], abi=CONTRACT["abi"])
    a = eth(w3, known_tokens=(token.address,))
    addr = a.address_for_index(500 + next(_counter))
    cursor = tip_cursor(w3)
    stray.functions.transfer(addr, 3_000_000).transact({"from": w3.eth.accounts[0]})
    token.functions.transfer(addr, 4_000_000).transact({"from": w3.eth.accounts[0]})  # ours: not foreign
    mine(w3)
    r = a.scan({addr}, cursor)
    assert r.payments == []
    assert [(f["token"], f["to"], f["value"]) for f in r.foreign] == [(stray.address.lower(), addr, "3000000")]


def test_token_transfers_are_identified_by_content_not_log_index(anvil, token):
    from billing.payments.coins.evm import transfer_identity

    w3 = anvil
    a = usdc(w3, token)
    x = a.address_for_index(600 + next(_counter))
    cursor = tip_cursor(w3)
    payer = w3.eth.accounts[0]
    token.functions.transfer(w3.eth.accounts[2], 1).transact({"from": payer})  # shifts the log indexes
    token.functions.batchTransfer([x, x], [2_000_000, 2_000_000]).transact({"from": payer})
    mine(w3)
    r = a.scan({x}, cursor)
    txid = r.payments[0].txid
    content = (token.address.lower(), payer.lower(), x.lower(), 2_000_000)
    assert sorted(p.output_index for p in r.payments) == sorted(
        [transfer_identity(*content, 1), transfer_identity(*content, 2)])  # two equal transfers, two payments
    receipt = w3.eth.get_transaction_receipt(txid)
    assert {p.output_index for p in r.payments}.isdisjoint({log["logIndex"] for log in receipt["logs"]})


def test_wrong_chain_or_unconfigured_token_contract_is_refused(anvil, token, forwarder):
    with pytest.raises(ValueError, match="the node is on chain 31337, ETH_CHAIN_ID is 1"):
        EvmAdapter(Coin.ETH, eth_account_xpub(), w3=anvil, chain_id=1).scan(set(), {})
    nowhere = "0x" + "12" * 20
    with pytest.raises(ValueError, match="no contract at .* on chain 31337"):
        usdc(anvil, type("T", (), {"address": anvil.to_checksum_address(nowhere)})).scan(set(), {})
    with pytest.raises(ValueError, match="does not answer decimals"):
        usdc(anvil, forwarder).scan(set(), {})
    usdc(anvil, token).verify_chain()  # 6 decimals read from the contract, as USDC is quoted
