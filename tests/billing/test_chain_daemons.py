"""The Monero regtest session fixture (chain_daemons.py) keeps its spending wallet usable for
every test after it: the chain stays out of reach of the wallet's decoy-picker loop, and a
call that timed out restarts the wallet server instead of leaving it wedged."""

from __future__ import annotations

import pytest

from billing.payments.coins.monero import MoneroWalletRpc
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
