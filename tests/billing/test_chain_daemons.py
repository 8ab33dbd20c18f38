"""The Monero regtest session fixture (chain_daemons.py) keeps its spending wallet usable for
every test after it: the chain stays out of reach of the wallet's decoy-picker loop; a call
that timed out restarts the wallet server instead of leaving it wedged; a wallet behind the
pool (killed before it saved) does not spend an output twice; a transfer whose reply was lost
is not paid again; and a refused transfer says why."""

from __future__ import annotations

import pytest

from billing.payments.coins.monero import MoneroRpcError, MoneroWalletRpc
from tests.billing.chain_daemons import RING_CANDIDATES


def test_the_session_chain_starts_past_the_funders_decoy_picker_loop(monero_regtest):
    """monero-wallet-rpc 0.18.0 loops forever picking ring members when the block at the
    picker's edge straddles its 75th candidate; the chain starts past that, and a reorg that
    would go back below its start is refused before any block is popped."""
    net = monero_regtest
    assert net.pickable_outputs() > RING_CANDIDATES
    height = net.height()
    with pytest.raises(AssertionError, match="below the session chain's start"):
        net.reorg(height - net.floor + 1, without=[])
    assert net.height() == height


def test_a_funder_call_that_timed_out_restarts_its_wallet_and_the_next_payment_goes_through(
        monero_regtest, monkeypatch):
    net = monero_regtest
    before = net.funder.process
    real_call, timeouts = MoneroWalletRpc.call, []

    def one_timeout(self, method, **params):
        if self is net.funder and method == "transfer" and not timeouts:
            timeouts.append(method)
            raise TimeoutError("timed out")
        return real_call(self, method, **params)

    monkeypatch.setattr(MoneroWalletRpc, "call", one_timeout)
    address = net.merchant.call("create_address", account_index=0)["address"]
    with pytest.raises(TimeoutError):
        net.pay(address, 1_000_000_000)
    assert net.funder.process is not before and before.poll() is not None
    assert net.funder.process.poll() is None

    sent = net.pay(address, 1_000_000_000)
    pool = net._daemon("/get_transaction_pool_hashes", {})
    assert sent["tx_hash"] in pool["tx_hashes"]
    net.mine(1)


def _killed_after_paying(net, address: str) -> set[str]:
    """Three payments left in the pool, then the wallet server killed before it saved them:
    restarted on its files, it no longer knows those outputs are spent."""
    sent = {net.pay(address, 1_000_000_000)["tx_hash"] for _ in range(3)}
    net.funder.process.kill()
    net.funder.process.wait()
    net.funder.restart()
    return sent


def test_a_funder_killed_after_paying_spends_only_what_the_pool_leaves_it(monero_regtest):
    """Without asking monerod first (``rescan_spent``), the restarted wallet spends an output
    a pooled payment spends, and monerod refuses it as a double spend."""
    net = monero_regtest
    address = net.merchant.call("create_address", account_index=0)["address"]
    earlier = _killed_after_paying(net, address)
    later = {net.pay(address, 1_000_000_000)["tx_hash"] for _ in range(2)}
    assert earlier | later <= net.funder.pool() and not earlier & later
    net.mine(1)
    assert not net.funder.pool() & (earlier | later)


def test_a_refused_transfer_names_monerods_reason(monero_regtest, monkeypatch):
    net = monero_regtest
    address = net.merchant.call("create_address", account_index=0)["address"]
    _killed_after_paying(net, address)
    real_call = MoneroWalletRpc.call
    monkeypatch.setattr(MoneroWalletRpc, "call", lambda self, method, **params: (
        {} if method == "rescan_spent" else real_call(self, method, **params)))
    with pytest.raises(MoneroRpcError, match="rejected by daemon.*monerod said: tx verification failed: double spend"):
        net.pay(address, 1_000_000_000)
    monkeypatch.undo()
    net.pay(address, 1_000_000_000)  # asking monerod again, the wallet spends another output
    net.mine(1)


def test_a_transfer_that_reached_the_pool_while_the_wallet_said_no_connection_is_paid_once(
        monero_regtest, monkeypatch):
    net = monero_regtest
    address = net.merchant.call("create_address", account_index=0)["address"]
    real_call, lost = MoneroWalletRpc.call, []

    def reply_lost(self, method, **params):
        result = real_call(self, method, **params)
        if method == "transfer" and not lost:
            lost.append(result["tx_hash"])
            raise MoneroRpcError("transfer: {'code': -1, 'message': 'no connection to daemon'}")
        return result

    before = net.funder.pool()
    monkeypatch.setattr(MoneroWalletRpc, "call", reply_lost)
    sent = net.pay(address, 1_000_000_000)
    assert sent["tx_hash"] == lost[0] and net.funder.pool() - before == {lost[0]}
    net.mine(1)
