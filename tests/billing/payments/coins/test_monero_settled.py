"""The Monero adapter after settlement, against wallet answers shaped as monero-wallet-rpc
gives them (``get_height``, ``get_transfers`` with ``in``/``pool``): a settled transfer is
still looked for within ``settled_watch_blocks`` — gone is ``reorged``, back in the pool is
watched again (and ``dropped`` if it then leaves unmined), past the window it is forgotten —
and a cursor written before heights were kept is read. The deep reorg on a real monerod is
tests/billing/payments/coins/test_monero_regtest.py and tests/billing/payments/test_adversarial_chains.py."""
from billing.payments.coins.monero import MoneroAdapter

TX = "ab" * 32
ADDRESS = "8" + "1" * 94


class Wallet:
    """What the view-only wallet shows: its height and the transfers to subaddress 3."""

    def __init__(self):
        self.height, self.mined_at, self.in_pool = 100, None, False

    def call(self, method, **params):
        if method == "refresh":
            return {}
        if method == "get_height":
            return {"height": self.height}
        assert method == "get_transfers" and params["subaddr_indices"] == [3]
        transfer = {"txid": TX, "amount": 5_000, "subaddr_index": {"major": 0, "minor": 3}, "unlock_time": 0,
                    "timestamp": 1_767_000_000}
        if self.mined_at is not None:
            return {"in": [{**transfer, "height": self.mined_at, "confirmations": self.height - self.mined_at}]}
        return {"pool": [{**transfer, "height": 0}]} if self.in_pool else {}


def settled(wallet, adapter):
    """Mined at 100, scanned at 10 confirmations: settled."""
    wallet.mined_at, wallet.height = 100, 110
    r = adapter.scan({ADDRESS: 3}, {})
    assert [(p.txid, p.confirmations) for p in r.payments] == [(TX, 10)]
    assert r.cursor == {"pending": {}, "settled": {f"{TX}:3": 100}}
    return r.cursor


def test_a_settled_transfer_gone_within_the_window_is_reorged_once():
    wallet = Wallet()
    xmr = MoneroAdapter(wallet, settled_watch_blocks=20)
    cursor = settled(wallet, xmr)
    wallet.height = 115
    r = xmr.scan({ADDRESS: 3}, cursor)
    assert (r.payments, r.reorged) == ([], [])
    wallet.mined_at, wallet.height = None, 116  # a 16-block reorg took it (deeper than its 10 confirmations)
    r = xmr.scan({ADDRESS: 3}, r.cursor)
    assert r.reorged == [(TX, 3)] and r.cursor == {"pending": {}, "settled": {}}
    assert xmr.scan({ADDRESS: 3}, r.cursor).reorged == []


def test_a_settled_transfer_past_the_window_is_forgotten():
    wallet = Wallet()
    xmr = MoneroAdapter(wallet, settled_watch_blocks=20)
    cursor = settled(wallet, xmr)
    wallet.height = 120  # 20 blocks past its block: still watched
    cursor = xmr.scan({ADDRESS: 3}, cursor).cursor
    assert cursor["settled"] == {f"{TX}:3": 100}
    wallet.height = 121
    cursor = xmr.scan({ADDRESS: 3}, cursor).cursor
    assert cursor["settled"] == {}
    wallet.mined_at = None
    assert xmr.scan({ADDRESS: 3}, cursor).reorged == []


def test_a_settled_transfer_back_in_the_pool_is_watched_again_then_dropped_or_mined():
    wallet = Wallet()
    xmr = MoneroAdapter(wallet)
    cursor = settled(wallet, xmr)
    wallet.mined_at, wallet.in_pool = None, True  # its block orphaned, the transfer back in the pool
    r = xmr.scan({ADDRESS: 3}, cursor)
    assert [(p.txid, p.confirmations) for p in r.payments] == [(TX, 0)] and r.reorged == []
    assert r.cursor == {"pending": {f"{TX}:3": 0}, "settled": {}}
    wallet.in_pool = False  # double-spent out of the pool
    gone = xmr.scan({ADDRESS: 3}, r.cursor)
    assert gone.dropped == [(TX, 3, "dropped")] and gone.reorged == []

    wallet.mined_at, wallet.height = 105, 110  # or: mined again, shallower
    r = xmr.scan({ADDRESS: 3}, r.cursor)
    assert [p.confirmations for p in r.payments] == [5] and r.cursor["pending"] == {f"{TX}:3": 5}
    wallet.height = 115
    r = xmr.scan({ADDRESS: 3}, r.cursor)
    assert [p.confirmations for p in r.payments] == [10] and r.cursor["settled"] == {f"{TX}:3": 105}


def test_a_cursor_from_before_the_heights_is_read():
    """Its settled transfers are a list of keys: one the wallet still shows gets its height;
    one it does not show cannot be judged (when was it mined?) and is forgotten."""
    wallet = Wallet()
    xmr = MoneroAdapter(wallet)
    wallet.mined_at, wallet.height = 100, 130
    r = xmr.scan({ADDRESS: 3}, {"pending": {}, "settled": [f"{TX}:3", "cd" * 32 + ":3"]})
    assert (r.payments, r.reorged, r.cursor["settled"]) == ([], [], {f"{TX}:3": 100})


def test_the_window_must_fit_in_the_late_watch_or_check_deploy_fails(settings):
    from billing.checks import xmr_settled_watch_within_late_watch

    settings.LATE_PAYMENT_WATCH_DAYS = 1
    settings.XMR_SETTLED_WATCH_BLOCKS = 720  # 24 h of 2-minute blocks: fits exactly
    assert xmr_settled_watch_within_late_watch(None) == []
    settings.XMR_SETTLED_WATCH_BLOCKS = 721
    assert [e.id for e in xmr_settled_watch_within_late_watch(None)] == ["billing.E003"]
