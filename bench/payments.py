"""Benchmark: one Core-RPC watcher pass over a block of 5,000 transactions against 10,000
watched addresses (open quotes), fed by a fake RPC returning a prepared ``getblock``
verbosity-2 result; compared with a baseline pass that only iterates the outputs (same
run). Matching is one set lookup per output, so the pass is O(outputs), independent of
the number of open quotes.

    .venv/bin/python bench/payments.py [--txs 5000] [--watched 10000] [--repeat 20]

``--mempool 100000``: instead, the mempool scan against a fake node holding that many
transactions (fetched in JSON-RPC batches of ``MEMPOOL_BATCH``): the first pass (every
transaction fetched and matched) and a steady pass (``--churn`` of the pool replaced since
the last pass), against ``--watched`` addresses; both must stay under the watch interval
(30 s). The fake answers in memory, so this measures our side of the scan (the node's own
time to serialise transactions comes on top; batching keeps it to one request per batch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from decimal import Decimal

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bip_utils import Bip39SeedGenerator, Bip84, Bip84Coins  # noqa: E402

from billing.payments.coins.base import Coin  # noqa: E402
from billing.payments.coins.utxo import UtxoAdapter, _output_address  # noqa: E402


def synthetic_block(n_txs: int, paying: list[str], height: int = 1) -> dict:
    """``n_txs`` transactions of 2 outputs each (payee + change); ``paying`` get paid."""
    txs = []
    for i in range(n_txs):
        to = paying[i] if i < len(paying) else f"bc1qunwatched{i:040d}"
        txs.append({
            "txid": f"{i:064x}",
            "vin": [{"txid": f"{i + 10**6:064x}", "vout": 0}],
            "vout": [
                {"n": 0, "value": Decimal("0.00123456"), "scriptPubKey": {"address": to, "type": "witness_v0_keyhash"}},
                {"n": 1, "value": Decimal("0.5"), "scriptPubKey": {"address": f"bc1qchange{i:040d}"}},
            ],
        })
    return {"hash": f"{height:064x}", "height": height, "previousblockhash": f"{height - 1:064x}", "tx": txs,
            "time": 1_700_000_000 + 600 * height}


class FakeMempoolRpc:
    """getblockcount/getblockhash at height 0, getrawmempool, batched getrawtransaction."""

    def __init__(self, txs: dict[str, dict]):
        self.txs, self.batches = txs, 0

    def call(self, method, *params):
        if method == "getblockcount":
            return 0
        if method == "getblockhash":
            return "0" * 64
        if method == "getrawmempool":
            return list(self.txs)
        if method == "getmempoolentry":
            return {"time": 1_700_000_000}
        if method == "getrawtransaction":
            return self.txs[params[0]]
        raise AssertionError(method)

    def call_many(self, method, params):
        assert method == "getrawtransaction"
        self.batches += 1
        return [self.txs[txid] for txid, _ in params]


def mempool_bench(args, adapter, addrs: list[str]) -> None:
    paying = addrs[: args.paid]
    txs = {t["txid"]: t for t in synthetic_block(args.mempool, paying)["tx"]}
    rpc = FakeMempoolRpc(txs)
    adapter.rpc, adapter.include_mempool = rpc, True
    watched = dict.fromkeys(addrs)
    cursor = {"height": 0, "hashes": {"0": "0" * 64}}
    t = time.perf_counter()
    result = adapter.scan(watched, cursor)
    cold = time.perf_counter() - t
    assert len(result.payments) == args.paid, len(result.payments)
    cold_batches = rpc.batches
    steady = []
    for r in range(args.repeat):
        for txid in list(txs)[args.paid: args.paid + int(args.mempool * args.churn)]:  # mined or evicted ...
            del txs[txid]
        for i in range(int(args.mempool * args.churn)):  # ... and new ones arrived
            tx = synthetic_block(1, [], height=1)["tx"][0]
            tx["txid"] = f"{10**9 + r * args.mempool + i:064x}"
            txs[tx["txid"]] = tx
        t = time.perf_counter()
        result = adapter.scan(watched, result.cursor)
        steady.append(time.perf_counter() - t)
    print(f"mempool: {args.mempool} transactions / {2 * args.mempool} outputs; watched addresses: {len(watched)}")
    print(f"first pass (fetch + match all, {cold_batches} batches): {cold:.2f} s")
    print(f"steady pass ({args.churn:.0%} of the pool new): {statistics.median(steady) * 1000:.0f} ms "
          f"(median of {args.repeat}); watch interval 30 s")


class FakeRpc:
    def __init__(self, block: dict):
        self.block = block

    def call(self, method, *params):
        if method == "getblockcount":
            return self.block["height"]
        if method == "getblockhash":
            return self.block["hash"] if params[0] == self.block["height"] else self.block["previousblockhash"]
        if method == "getblock":
            return self.block
        raise AssertionError(method)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--txs", type=int, default=5000)
    ap.add_argument("--watched", type=int, default=10000)
    ap.add_argument("--paid", type=int, default=500, help="transactions in the block that pay a quote")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--mempool", type=int, default=0, help="benchmark the mempool scan with this many transactions")
    ap.add_argument("--churn", type=float, default=0.01, help="share of the mempool replaced between passes")
    args = ap.parse_args()

    seed = Bip39SeedGenerator("abandon " * 11 + "about").Generate()
    zpub = Bip84.FromSeed(seed, Bip84Coins.BITCOIN).Purpose().Coin().Account(0).PublicKey().ToExtended()
    t0 = time.perf_counter()
    adapter = UtxoAdapter(Coin.BTC, zpub, include_mempool=False)
    watched = {adapter.address_for_index(i): i for i in range(args.watched)}
    derive_s = time.perf_counter() - t0
    addrs = list(watched)
    if args.mempool:
        print(f"derive {args.watched} addresses: {derive_s:.2f} s (one-off)")
        return mempool_bench(args, adapter, addrs)
    block = synthetic_block(args.txs, addrs[: args.paid])
    adapter.rpc = FakeRpc(block)
    cursor = {"height": block["height"] - 1, "hashes": {str(block["height"] - 1): block["previousblockhash"]}}

    def watcher_pass():
        return adapter.scan(watched, cursor)

    def baseline_pass():  # iterate the outputs and read their address, no matching
        n = 0
        for tx in adapter.rpc.call("getblock", block["hash"], 2)["tx"]:
            for vout in tx["vout"]:
                if _output_address(vout) is not None:
                    n += 1
        return n

    r = watcher_pass()
    assert len(r.payments) == args.paid, len(r.payments)
    outputs = sum(len(t["vout"]) for t in block["tx"])
    w_times, b_times = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        baseline_pass()
        b_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        watcher_pass()
        w_times.append(time.perf_counter() - t)
    w, b = statistics.median(w_times), statistics.median(b_times)
    print(f"block: {args.txs} txs / {outputs} outputs; watched addresses: {args.watched}; paid: {args.paid}")
    print(f"derive {args.watched} addresses: {derive_s:.2f} s (one-off)")
    print(f"watcher pass (match + {args.paid} payments + cursor): {w * 1000:.2f} ms (median of {args.repeat})")
    print(f"baseline (iterate outputs only):                 {b * 1000:.2f} ms")
    print(f"ratio watcher/baseline: {w / b:.2f}x")


if __name__ == "__main__":
    main()
