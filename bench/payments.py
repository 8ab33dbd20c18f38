"""Benchmark: one Core-RPC watcher pass over a block of 5,000 transactions against 10,000
watched addresses (open quotes), fed by a fake RPC returning a prepared ``getblock``
verbosity-2 result; compared with a baseline pass that only iterates the outputs (same
run). Matching is one set lookup per output, so the pass is O(outputs), independent of
the number of open quotes.

    .venv/bin/python bench/payments.py [--txs 5000] [--watched 10000] [--repeat 20]
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
    return {"hash": f"{height:064x}", "height": height, "previousblockhash": f"{height - 1:064x}", "tx": txs}


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
    args = ap.parse_args()

    seed = Bip39SeedGenerator("abandon " * 11 + "about").Generate()
    zpub = Bip84.FromSeed(seed, Bip84Coins.BITCOIN).Purpose().Coin().Account(0).PublicKey().ToExtended()
    t0 = time.perf_counter()
    adapter = UtxoAdapter(Coin.BTC, zpub, include_mempool=False)
    watched = {adapter.address_for_index(i): i for i in range(args.watched)}
    derive_s = time.perf_counter() - t0
    addrs = list(watched)
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
