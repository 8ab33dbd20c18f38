"""XMR on a real monerod regtest chain: a funded wallet pays subaddresses of a VIEW-ONLY
merchant wallet served by monero-wallet-rpc; the adapter sees them in the pool (0 conf),
then mined, up to the 10 confirmations."""

from __future__ import annotations

import pytest

from billing.payments.coins.monero import MoneroAdapter


@pytest.fixture(scope="module")
def xmr(monero_regtest):
    return MoneroAdapter(monero_regtest.merchant)


def test_subaddress_payment_pool_then_confirmed(monero_regtest, xmr):
    net = monero_regtest
    a1, i1 = xmr.create_address(label="quote 1")
    a2, i2 = xmr.create_address(label="quote 2")
    assert i2 == i1 + 1 and xmr.address_for_index(i1) == a1
    assert xmr.payment_uri(a1, 1_500_000_000_000).endswith("?tx_amount=1.5")

    net.funder.call("refresh")  # no auto-refresh (conftest): spend what the chain holds now
    tx = net.funder.call("transfer", destinations=[
        {"address": a1, "amount": 1_250_000_000_000}, {"address": a2, "amount": 20_000_000}])
    watch = {a1: i1, a2: i2}
    r = xmr.scan(watch, {})
    got = {p.address: p for p in r.payments}
    assert set(got) == {a1, a2}
    assert (got[a1].txid, got[a1].amount, got[a1].confirmations, got[a1].output_index) == (
        tx["tx_hash"], 1_250_000_000_000, 0, i1)
    assert got[a2].amount == 20_000_000 and got[a2].output_index == i2

    net.mine(1)
    r = xmr.scan(watch, r.cursor)
    assert sorted(p.confirmations for p in r.payments) == [1, 1]
    assert all(p.block_height is not None for p in r.payments)
    net.mine(9)
    r = xmr.scan(set(watch), r.cursor)  # a plain set works too (index looked up)
    assert sorted(p.confirmations for p in r.payments) == [10, 10]
    net.mine(1)
    r = xmr.scan(watch, r.cursor)
    assert r.payments == [] and r.reorged == []  # settled: not reported again


def test_a_settled_payment_gone_in_a_reorg_deeper_than_its_confirmations_is_reported(monero_regtest):
    """Settled at 10 confirmations, then an 11-block reorg whose chain lacks the transfer: the
    view-only wallet no longer shows it and the adapter reports it reorged (once); past
    ``settled_watch_blocks`` a settled transfer is no longer looked for."""
    net = monero_regtest
    xmr = MoneroAdapter(net.merchant, settled_watch_blocks=30)
    net.funder.call("refresh")
    (a, i), (b, j) = xmr.create_address(label="reorged"), xmr.create_address(label="kept")
    gone = net.funder.call("transfer", destinations=[{"address": a, "amount": 3_000_000_000}])["tx_hash"]
    net.funder.call("transfer", destinations=[{"address": b, "amount": 4_000_000_000}])
    watch = {a: i, b: j}
    r = xmr.scan(watch, {})
    net.mine(10)
    r = xmr.scan(watch, r.cursor)
    assert sorted((p.amount, p.confirmations) for p in r.payments) == [(3_000_000_000, 10), (4_000_000_000, 10)]
    net.mine(1)
    r = xmr.scan(watch, r.cursor)
    assert r.payments == [] and r.reorged == [] and r.cursor["pending"] == {}  # settled, quiet, still watched

    kept = next(k for k in r.cursor["settled"] if k.endswith(f":{j}"))
    mined_first = r.cursor["settled"][kept]
    net.reorg(11, without=[gone])  # 11 > 10 confirmations; the other transfer is mined again
    net.forget_dropped_spends()  # the funder's spend left the chain: later tests must not build on it
    r = xmr.scan(watch, r.cursor)
    assert r.reorged == [(gone, i)] and r.dropped == []
    # the other one is mined again in the new chain's first block (its old height), 12 deep: still settled
    assert r.payments == [] and r.cursor["settled"] == {kept: mined_first}
    r = xmr.scan(watch, r.cursor)
    assert r.reorged == [] and r.payments == []  # reported once

    net.mine(31)  # past the window the cursor forgets it: nothing of it is kept or reported
    r = xmr.scan(watch, r.cursor)
    assert r.cursor["settled"] == {} and r.reorged == []
