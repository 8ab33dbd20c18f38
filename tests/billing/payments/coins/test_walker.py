"""The block walker shared by the UTXO and EVM adapters, against an in-memory chain of
BlockInfo objects (no node): where a new watcher starts, how many blocks one pass scans,
confirmations reported until they reach the requirement, reorgs (before and during a pass)
and the bounded cursor."""

from __future__ import annotations

import json
from collections.abc import Callable

from billing.payments.coins import Coin
from billing.payments.coins.base import DetectedPayment
from billing.payments.coins.walker import BlockInfo, Found, walk

ADDR = "bc1qwatched0000000000000000000000000000000"
T0 = 1_700_000_000  # genesis time; one block every 600 s


def pay(txid: str, amount: int, n: int = 0) -> Found:
    return Found(txid, n, ADDR, amount)


class Chain:
    """An in-memory node: ``blocks[h]`` is the block at height h. ``before_block[h]`` runs once
    when the walker asks for block h (to change the chain under a running pass)."""

    def __init__(self):
        self.blocks: list[BlockInfo] = []
        self.before_block: dict[int, Callable[[], None]] = {}
        self.mine()  # genesis

    def mine(self, *found: Found, fork: str = "") -> BlockInfo:
        h = len(self.blocks)
        prev = self.blocks[-1].hash if self.blocks else None
        b = BlockInfo(f"{h:04d}{fork}".ljust(64, "0"), prev, list(found), T0 + 600 * h)
        self.blocks.append(b)
        return b

    def reorg(self, fork_height: int) -> None:
        """Drop the blocks from ``fork_height`` on (the caller mines the replacements)."""
        del self.blocks[fork_height:]

    def block(self, h: int) -> BlockInfo:
        hook = self.before_block.pop(h, None)
        if hook is not None:
            hook()
        return self.blocks[h]

    def scan(self, cursor: dict, *, required: int = 2, **kw):
        # the cursor is persisted as JSON between passes
        return walk(Coin.BTC, json.loads(json.dumps(cursor)), tip=lambda: len(self.blocks) - 1,
                    hash_at=lambda h: self.blocks[h].hash, block=self.block, required=required, **kw)


def seen(result) -> list[tuple[str, int, int]]:
    """(txid, confirmations, block height) of the reported payments."""
    return sorted((p.txid, p.confirmations, p.block_height) for p in result.payments)


def test_a_pass_scans_at_most_max_blocks_and_the_cursor_says_how_many_are_left():
    chain = Chain()
    for h in range(1, 11):
        chain.mine(pay(f"tx{h}", 1_000 * h))
    r = chain.scan({}, start_height=1, max_blocks=3)
    assert seen(r) == [("tx1", 10, 1), ("tx2", 9, 2), ("tx3", 8, 3)]
    assert (r.cursor["height"], r.cursor["behind"]) == (3, 7)
    r = chain.scan(r.cursor, max_blocks=3)
    assert [p.txid for p in r.payments] == ["tx4", "tx5", "tx6"]
    assert (r.cursor["height"], r.cursor["behind"]) == (6, 4)
    r = chain.scan(r.cursor, max_blocks=3)
    assert (r.cursor["height"], r.cursor["behind"]) == (9, 1)
    r = chain.scan(r.cursor, max_blocks=3)
    assert [p.txid for p in r.payments] == ["tx10"]
    assert (r.cursor["height"], r.cursor["behind"]) == (10, 0)  # caught up: the watcher may mark "scanned to"


def test_new_watcher_without_start_height_starts_at_the_tip_then_reports_each_block():
    chain = Chain()
    chain.mine(pay("old", 5_000))
    r = chain.scan({})
    assert r.payments == [] and r.cursor["height"] == 1 and r.cursor["behind"] == 0
    b2 = chain.mine(pay("tx-a", 150_000_000, n=1))
    r = chain.scan(r.cursor)
    assert r.payments == [DetectedPayment(
        coin=Coin.BTC, txid="tx-a", output_index=1, address=ADDR, amount=150_000_000, confirmations=1,
        block_hash=b2.hash, block_height=2, chain_time=T0 + 1_200,
    )]
    assert r.reorged == [] and r.cursor["height"] == 2


def test_payment_is_reported_again_on_each_block_until_it_reaches_the_required_confirmations():
    chain = Chain()
    r = chain.scan({})
    chain.mine(pay("tx-a", 40_000))
    r = chain.scan(r.cursor, required=3)
    assert seen(r) == [("tx-a", 1, 1)]
    chain.mine()
    r = chain.scan(r.cursor, required=3)
    assert seen(r) == [("tx-a", 2, 1)]
    chain.mine()
    chain.mine(pay("tx-b", 7_000))
    r = chain.scan(r.cursor, required=3)
    assert seen(r) == [("tx-a", 4, 1), ("tx-b", 1, 4)]
    chain.mine()
    r = chain.scan(r.cursor, required=3)
    assert seen(r) == [("tx-b", 2, 4)]  # tx-a was reported with enough confirmations: done


def test_payment_with_its_confirmations_is_not_reported_again_while_no_block_comes():
    chain = Chain()
    r = chain.scan({})
    chain.mine(pay("tx-a", 40_000))
    r = chain.scan(r.cursor, required=1)
    assert seen(r) == [("tx-a", 1, 1)]
    r = chain.scan(r.cursor, required=1)
    assert r.payments == [] and r.reorged == [] and r.cursor["height"] == 1


def test_watcher_with_start_height_scans_from_that_block_and_not_before():
    chain = Chain()
    for h in range(1, 9):
        chain.mine(*([pay(f"tx{h}", 1_000 * h)] if h in (4, 5, 6) else []))
    r = chain.scan({}, start_height=5)
    assert seen(r) == [("tx5", 4, 5), ("tx6", 3, 6)]
    assert r.cursor["height"] == 8 and r.cursor["behind"] == 0


def test_reorg_reports_the_orphaned_payment_and_keeps_the_one_below_the_fork():
    chain = Chain()
    r = chain.scan({})
    chain.mine(pay("tx-a", 10_000))
    r = chain.scan(r.cursor, required=1)
    chain.mine(pay("tx-b", 20_000), pay("tx-d", 30_000))
    r = chain.scan(r.cursor, required=1)
    assert seen(r) == [("tx-b", 1, 2), ("tx-d", 1, 2)]
    # block 2 is replaced: tx-d is mined again in the new block, tx-b is gone, tx-c is new
    chain.reorg(2)
    new2 = chain.mine(pay("tx-d", 30_000), pay("tx-c", 5_000), fork="b")
    chain.mine(fork="b")
    r = chain.scan(r.cursor, required=1)
    assert r.reorged == [("tx-b", 0)]
    assert seen(r) == [("tx-c", 2, 2), ("tx-d", 2, 2)]  # tx-a (block 1, below the fork) is not touched
    assert {p.block_hash for p in r.payments} == {new2.hash}
    assert [t["txid"] for t in r.cursor["tracked"]] == ["tx-a", "tx-c", "tx-d"]
    r = chain.scan(r.cursor, required=1)
    assert r.payments == [] and r.reorged == []


def test_chain_changing_during_a_pass_stops_it_and_the_next_pass_reports_the_orphan():
    chain = Chain()
    r = chain.scan({})
    chain.mine(pay("tx-a", 10_000))
    chain.mine()

    def node_reorgs():  # between the walker's reads of block 1 and block 2
        chain.reorg(1)
        chain.mine(fork="b")
        chain.mine(pay("tx-e", 60_000), fork="b")

    chain.before_block[2] = node_reorgs
    r = chain.scan(r.cursor)
    assert seen(r) == [("tx-a", 2, 1)]  # block 2 is on another chain: not taken
    assert (r.cursor["height"], r.cursor["behind"]) == (1, 1)
    r = chain.scan(r.cursor)
    assert r.reorged == [("tx-a", 0)]
    assert seen(r) == [("tx-e", 1, 2)]
    assert r.cursor["hashes"] == {"1": chain.blocks[1].hash, "2": chain.blocks[2].hash}


def test_cursor_remembers_only_the_last_keep_blocks_and_their_payments():
    chain = Chain()
    r = chain.scan({})
    for h in range(1, 7):
        chain.mine(pay(f"tx{h}", 1_000 * h))
    r = chain.scan(r.cursor, required=1, keep=3)
    assert len(r.payments) == 6
    assert r.cursor["hashes"] == {str(h): chain.blocks[h].hash for h in (4, 5, 6)}
    assert [(t["txid"], t["height"]) for t in r.cursor["tracked"]] == [("tx4", 4), ("tx5", 5), ("tx6", 6)]
