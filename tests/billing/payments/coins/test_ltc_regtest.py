"""The Core-RPC watcher end to end on a real Litecoin Core 0.21 regtest chain.

Payments go to ``rltc1`` addresses from OUR derivation (a ttub of the test mnemonic); the
watcher uses the node without a wallet. Covers confirmations, mempool (0-conf), several
outputs in one transaction, reorg (invalidateblock), restart from a persisted cursor,
duplicate reports across passes and watchers.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from bip_utils import Base58Decoder, Base58Encoder, Bip39SeedGenerator, Bip84, Bip84Coins

from billing.payments.coins.base import Coin
from billing.payments.coins.utxo import UtxoAdapter
from tests.billing.chain_daemons import TEST_MNEMONIC


def ltc_test_account_key() -> str:
    seed = Bip39SeedGenerator(TEST_MNEMONIC).Generate()
    return Bip84.FromSeed(seed, Bip84Coins.LITECOIN_TESTNET).Purpose().Coin().Account(0).PublicKey().ToExtended()


def reversion(xpub: str, version_hex: str) -> str:
    raw = Base58Decoder.CheckDecode(xpub)
    return Base58Encoder.CheckEncode(bytes.fromhex(version_hex) + raw[4:])


def as_tpub(xpub: str) -> str:
    return reversion(xpub, "043587cf")


def as_vpub(xpub: str) -> str:
    return reversion(xpub, "045f1cf6")


@pytest.fixture
def adapter(litecoind):
    """A fresh watcher starting at the current tip (cursor persisted by the test)."""
    return UtxoAdapter(Coin.LTC, as_vpub(ltc_test_account_key()), network="regtest", rpc=litecoind.rpc)


def tip_cursor(node) -> dict:
    return {"height": node.rpc.call("getblockcount")}


def by_key(result):
    return {(p.txid, p.output_index): p for p in result.payments}


def test_key_prefix_is_ttub():
    assert ltc_test_account_key().startswith("ttub")


@pytest.mark.parametrize(("descriptor", "prefix", "version", "starts"), [
    ("pkh({}/0/*)", "tpub", "043587cf", ("m", "n")),
    ("sh(wpkh({}/0/*))", "upub", "044a5262", ("Q",)),
    ("wpkh({}/0/*)", "vpub", "045f1cf6", ("rltc1q",)),
])
def test_each_key_kind_derives_what_litecoin_core_derives(litecoind, descriptor, prefix, version, starts):
    """Core's ``deriveaddresses`` is the reference: the same addresses from our descriptor
    parser (with origin and checksum) and from the SLIP-132 prefix that names the type."""
    tpub = as_tpub(ltc_test_account_key())
    desc = litecoind.rpc.call("getdescriptorinfo", descriptor.format(tpub))["descriptor"]
    core = litecoind.rpc.call("deriveaddresses", desc, [0, 4])
    with_origin = desc.replace(tpub, f"[73c5da0a/84h/1h/0h]{tpub}")
    for key in (desc, with_origin, reversion(tpub, version)):
        ours = UtxoAdapter(Coin.LTC, key, network="regtest")
        assert [ours.address_for_index(i) for i in range(5)] == core, key
    assert all(a.startswith(starts) for a in core)
    assert all(litecoind.rpc.call("validateaddress", a)["isvalid"] for a in core)


def test_our_derivation_matches_litecoin_core(litecoind, adapter):
    tpub = as_tpub(ltc_test_account_key())
    desc = litecoind.rpc.call("getdescriptorinfo", f"wpkh({tpub}/0/*)")["descriptor"]
    core = litecoind.rpc.call("deriveaddresses", desc, [0, 4])
    ours = [adapter.address_for_index(i) for i in range(5)]
    assert ours == core
    assert all(a.startswith("rltc1q") for a in ours)


def test_payment_seen_then_confirmed(litecoind, adapter):
    (i,) = litecoind.fresh_indexes(1)
    addr = adapter.address_for_index(i)
    watch = {addr: "quote-1"}
    cursor = tip_cursor(litecoind)
    txid = litecoind.wallet.call("sendtoaddress", addr, Decimal("0.12345678"))

    r = adapter.scan(watch, cursor)
    (p,) = r.payments
    assert (p.txid, p.address, p.amount, p.confirmations) == (txid, addr, 12345678, 0)
    assert p.block_hash is None and p.block_height is None
    cursor = json.loads(json.dumps(r.cursor))

    blocks = litecoind.mine(1)
    r = adapter.scan(watch, cursor)
    (p,) = r.payments
    assert (p.txid, p.confirmations, p.block_hash) == (txid, 1, blocks[0])
    tx = litecoind.rpc.call("getrawtransaction", txid, True, blocks[0])
    spk = tx["vout"][p.output_index]["scriptPubKey"]
    # Litecoin Core 0.21 still reports the older ``addresses`` list (no ``address``)
    assert spk.get("address", (spk.get("addresses") or [None])[0]) == addr
    cursor = r.cursor

    litecoind.mine(5)
    r = adapter.scan(watch, cursor)
    (p,) = r.payments
    assert p.confirmations == 6 == adapter.required_confirmations
    cursor = r.cursor

    litecoind.mine(1)
    r = adapter.scan(watch, cursor)
    assert r.payments == [] and r.reorged == []  # settled: not reported again


def test_two_outputs_in_one_tx_and_unwatched_ignored(litecoind, adapter):
    i, j, k = litecoind.fresh_indexes(3)
    a, b, c = (adapter.address_for_index(n) for n in (i, j, k))
    cursor = tip_cursor(litecoind)
    txid = litecoind.wallet.call("sendmany", "", {a: Decimal("0.1"), b: Decimal("0.2"), c: Decimal("0.3")})
    litecoind.mine(1)
    r = adapter.scan({a, b}, cursor)  # c is not watched
    got = {p.address: p for p in r.payments}
    assert set(got) == {a, b}
    assert got[a].txid == got[b].txid == txid
    assert got[a].output_index != got[b].output_index
    assert (got[a].amount, got[b].amount) == (10_000_000, 20_000_000)


def test_reorg_before_settlement_is_reported(litecoind):
    key = as_vpub(ltc_test_account_key())
    watcher = UtxoAdapter(Coin.LTC, key, network="regtest", rpc=litecoind.rpc, include_mempool=False)
    (i,) = litecoind.fresh_indexes(1)
    addr = watcher.address_for_index(i)
    cursor = tip_cursor(litecoind)
    txid = litecoind.wallet.call("sendtoaddress", addr, Decimal("0.5"))
    (orphan,) = litecoind.mine(1)
    r = watcher.scan({addr}, cursor)
    assert [(p.txid, p.confirmations, p.block_hash) for p in r.payments] == [(txid, 1, orphan)]
    cursor = r.cursor
    key_ = r.payments[0].key

    litecoind.rpc.call("invalidateblock", orphan)  # the tx goes back to the mempool
    r = watcher.scan({addr}, cursor)
    assert r.reorged == [key_]
    assert r.payments == []
    cursor = r.cursor

    # with the pool watched, the un-mined payment is "seen" again (0 conf), not reorged
    pool_watcher = UtxoAdapter(Coin.LTC, key, network="regtest", rpc=litecoind.rpc)
    r2 = pool_watcher.scan({addr}, cursor)
    assert [(p.txid, p.confirmations) for p in r2.payments] == [(txid, 0)]
    assert r2.reorged == []

    # a longer competing chain mines it again: found in the new block
    new_blocks = litecoind.mine(2, fresh=True)
    r = watcher.scan({addr}, cursor)
    (p,) = r.payments
    assert p.key == key_ and p.block_hash == new_blocks[0] != orphan and p.confirmations == 2
    assert r.reorged == []


def test_reorg_on_a_cursor_past_the_fork_rolls_back_several_blocks(litecoind):
    watcher = UtxoAdapter(Coin.LTC, as_vpub(ltc_test_account_key()), network="regtest", rpc=litecoind.rpc,
                          include_mempool=False)
    (i,) = litecoind.fresh_indexes(1)
    addr = watcher.address_for_index(i)
    cursor = tip_cursor(litecoind)
    litecoind.wallet.call("sendtoaddress", addr, Decimal("0.25"))
    first, *_ = litecoind.mine(3)
    r = watcher.scan({addr}, cursor)
    key_ = r.payments[0].key
    litecoind.rpc.call("invalidateblock", first)
    # the node's tip is now 3 blocks lower; mine 1 empty-of-our-tx block on the other branch
    litecoind.rpc.call("prioritisetransaction", key_[0], 0, -10**8)  # keep our tx out
    litecoind.mine(1, fresh=True)
    r = watcher.scan({addr}, r.cursor)
    assert r.reorged == [key_] and r.payments == []
    litecoind.rpc.call("prioritisetransaction", key_[0], 0, 10**8)


def test_restart_mid_scan_from_persisted_cursor_no_duplicates(litecoind):
    key = as_vpub(ltc_test_account_key())
    idx = litecoind.fresh_indexes(3)
    addrs = [UtxoAdapter(Coin.LTC, key, network="regtest").address_for_index(n) for n in idx]
    watch = set(addrs)
    start = tip_cursor(litecoind)
    txids = []
    for a in addrs:  # one payment per block
        txids.append(litecoind.wallet.call("sendtoaddress", a, Decimal("0.01")))
        litecoind.mine(1)
    expected = {t for t in txids}

    # a watcher that scans one block per pass, restarted (new object) from the stored cursor
    stored = json.dumps(start)
    credited: dict = {}
    for _ in range(3):
        w = UtxoAdapter(Coin.LTC, key, network="regtest", rpc=litecoind.rpc, include_mempool=False)
        r = w.scan(watch, json.loads(stored), max_blocks=1)
        for p in r.payments:
            credited.setdefault(p.key, p)  # the DB unique constraint, in small
        stored = json.dumps(r.cursor)
    assert {k[0] for k in credited} == expected

    # a crash after scanning but before saving the cursor: the pass is redone from the old
    # cursor and reports the same payments (same keys, same amounts) again
    w = UtxoAdapter(Coin.LTC, key, network="regtest", rpc=litecoind.rpc, include_mempool=False)
    again = w.scan(watch, json.loads(json.dumps(start)))
    assert {p.key: p.amount for p in again.payments} == {k: p.amount for k, p in credited.items()}
    # two watchers on the same cursor agree exactly (duplicate notification)
    other = UtxoAdapter(Coin.LTC, key, network="regtest", rpc=litecoind.rpc, include_mempool=False)
    twice = other.scan(watch, json.loads(json.dumps(start)))
    assert [(p.key, p.confirmations) for p in twice.payments] == [(p.key, p.confirmations) for p in again.payments]


def test_empty_cursor_starts_at_tip(litecoind, adapter):
    (i,) = litecoind.fresh_indexes(1)
    addr = adapter.address_for_index(i)
    r = adapter.scan({addr}, {})
    assert r.payments == [] and r.cursor["height"] == litecoind.rpc.call("getblockcount")
