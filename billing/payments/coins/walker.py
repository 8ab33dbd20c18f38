"""Chain-walking with reorg detection, shared by the UTXO (Core RPC) and EVM adapters.

Cursor (JSON): ``{"height": last scanned height, "hashes": {"<height>": hash, ...}
(last ``keep`` heights), "tracked": [payment found in those blocks, ...], "anchors":
{"<height>": hash} (where the watcher began, then every ``ANCHOR_EVERY``-th height; the last
``ANCHORS``), "recheck_to":
height (only while a deep reorg's re-walk is under way)}``.

A reorg deeper than the ``keep`` remembered hashes (every one of them differs from the
node's) is located with the anchors: the highest anchor the node still has is below the
fork, and the walk starts again from there. Payments found below the remembered window
are no longer tracked here, so the pass reports the heights it walked again
(``ScanResult.rewalked``) up to the old window: the caller judges the payments it recorded
in those blocks — not found again, they have left the chain (``services``).

Each pass: (1) check the remembered hash at the cursor height against the node; if it
differs, walk back to the fork point, drop the orphaned blocks and their payments;
(2) walk forward to the tip (or ``max_blocks``); (3) report new payments and, again, those
tracked payments whose confirmations have not yet been reported as reaching
``required``; orphaned payments not found again are ``reorged``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .base import Coin, DetectedPayment, ScanResult

KEEP_HASHES = 100
#: a deep reorg is located to within this many blocks ...
ANCHOR_EVERY = 100
#: ... as deep as ANCHOR_EVERY × ANCHORS blocks (5,000: 35 days of BTC, 8 of LTC, 17 h of ETH)
ANCHORS = 50


@dataclass(frozen=True)
class Found:
    txid: str
    output_index: int
    address: str
    amount: int


@dataclass
class BlockInfo:
    hash: str
    prev_hash: str | None
    found: Iterable[Found]
    time: int | None = None  # block timestamp (unix seconds)


def walk(
    coin: Coin,
    cursor: dict[str, Any],
    *,
    tip: Callable[[], int],
    hash_at: Callable[[int], str],
    block: Callable[[int], BlockInfo],
    required: int,
    start_height: int | None = None,
    max_blocks: int | None = None,
    keep: int = KEEP_HASHES,
) -> ScanResult:
    tip_h = tip()
    hashes: dict[str, str] = dict(cursor.get("hashes") or {})
    tracked: dict[tuple[str, int], dict] = {
        (t["txid"], t["n"]): dict(t) for t in cursor.get("tracked") or []
    }
    height = cursor.get("height")
    if height is None:
        height = (tip_h if start_height is None else start_height - 1)
    height = int(height)
    anchors: dict[str, str] = dict(cursor.get("anchors") or {})
    recheck_to = cursor.get("recheck_to")

    # 1. reorg detection: walk back while our remembered hash is not the node's
    orphaned: set[tuple[str, int]] = set()
    rolled_back = False
    while str(height) in hashes and (height > tip_h or hash_at(height) != hashes[str(height)]):
        del hashes[str(height)]
        height -= 1
        rolled_back = True
    if rolled_back and not hashes and cursor.get("hashes"):
        # every remembered hash differs: the fork is below the window. The highest anchor
        # the node still has is below it (none: the lowest anchor, as deep as we can see);
        # payments recorded from there up to the old window are judged again (``rewalked``).
        recheck_to = max(int(recheck_to or 0), height)
        height = _fork_below(anchors, height, tip_h, hash_at)
        anchors = {k: v for k, v in anchors.items() if int(k) <= height}
    if rolled_back:
        for key, t in list(tracked.items()):
            if t["height"] > height:
                orphaned.add(key)
                del tracked[key]

    if not anchors and 0 <= height <= tip_h:  # the first pass: where this watcher began
        anchors[str(height)] = hash_at(height)

    # 2. walk forward
    walked_from = height
    new: set[tuple[str, int]] = set()
    scanned = 0
    h = height + 1
    while h <= tip_h and (max_blocks is None or scanned < max_blocks):
        info = block(h)
        prev = hashes.get(str(h - 1))
        if prev is not None and info.prev_hash is not None and info.prev_hash != prev:
            break  # the chain changed under us mid-pass: the next pass rolls back
        hashes[str(h)] = info.hash
        if h % ANCHOR_EVERY == 0:
            anchors[str(h)] = info.hash
        for f in info.found:
            key = (f.txid, f.output_index)
            tracked[key] = {
                "txid": f.txid, "n": f.output_index, "address": f.address,
                "amount": str(f.amount), "height": h, "hash": info.hash, "reported": -1, "time": info.time,
            }
            new.add(key)
        height = h
        h += 1
        scanned += 1

    # 3. report
    payments: list[DetectedPayment] = []
    for key, t in tracked.items():
        conf = max(tip_h, height) - t["height"] + 1
        if key in new or t["reported"] < required:
            payments.append(DetectedPayment(
                coin=coin, txid=t["txid"], output_index=t["n"], address=t["address"],
                amount=int(t["amount"]), confirmations=conf,
                block_hash=t["hash"], block_height=t["height"], chain_time=t.get("time"),
            ))
            t["reported"] = conf
    low = height - keep
    hashes = {k: v for k, v in hashes.items() if int(k) > low}
    tracked = {k: t for k, t in tracked.items() if t["height"] > low}
    anchors = dict(sorted(anchors.items(), key=lambda kv: int(kv[0]))[-ANCHORS:])
    new_cursor = {
        "height": height,
        "behind": max(0, tip_h - height),  # blocks left to scan ("scanned to" the tip?)
        "hashes": hashes,
        "tracked": sorted(tracked.values(), key=lambda t: (t["height"], t["txid"], t["n"])),
        "anchors": anchors,
    }
    rewalked = None
    if recheck_to is not None:
        if height > walked_from:
            rewalked = (walked_from, min(height, int(recheck_to)))
        if height < int(recheck_to):
            new_cursor["recheck_to"] = int(recheck_to)
    reorged = sorted(k for k in orphaned if k not in tracked)
    return ScanResult(payments=payments, cursor=new_cursor, reorged=reorged, rewalked=rewalked)


def _fork_below(anchors: dict[str, str], height: int, tip_h: int, hash_at: Callable[[int], str]) -> int:
    """The highest anchored height at or below ``height`` whose block the node still has; none
    (a reorg deeper than the watcher's whole history): ANCHOR_EVERY below the lowest anchor,
    where the new chain may hold a payment it re-mined lower than it was."""
    below = sorted((int(k) for k in anchors if int(k) <= min(height, tip_h)), reverse=True)
    for a in below:
        if hash_at(a) == anchors[str(a)]:
            return a
    return max((below[-1] if below else height) - ANCHOR_EVERY, 0)
