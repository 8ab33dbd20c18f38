"""bench/store.py's jobs process: the work production's Celery worker does on the beat's
schedule (scripts/start.sh worker + beat), in a process of its own beside the servers, so
its CPU is measured apart (the timeline's "jobs") and takes nothing from the load
generator's event loop.

It calls the tasks' own functions — `billing.watch_payments` (every configured coin) every
`--payments-every` seconds and `billing.lifecycle_tick` (the lifecycle pass under its lock)
at `--lifecycle-at` and every `--lifecycle-every` seconds after — without the broker's hop:
beat's tick and the worker's dequeue are a Redis round trip each, not what is measured. The
payment watcher scans BTC against bench/payments.py's in-memory Core-RPC node holding
`--mempool` transactions, 1 % of them replaced between passes (the node's own serialisation
is not measured). Each pass is one JSON line on stdout:

    {"job": "payments" | "lifecycle", "at": <epoch>, "seconds": <pass>, "result": …}

It runs at the niceness Celery's worker and beat take (JOBS_NICENESS, storefront/celery.py).
Run by bench/store.py with the servers' environment; it exits at `--until`.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BASE), str(BASE / "bench")]


class ChainNode:
    """bench/payments.py's mempool node, with the best block's header the watcher dates the
    node by (a fresh tip: the coin stays healthy)."""

    def __init__(self, size: int):
        from payments import FakeMempoolRpc, synthetic_block

        self.synthetic_block, self.size, self.replaced = synthetic_block, size, 0
        self.rpc = FakeMempoolRpc({t["txid"]: t for t in synthetic_block(size, [])["tx"]})

    def call(self, method, *params):
        if method == "getbestblockhash":
            return "0" * 64
        if method == "getblockheader":
            return {"time": int(time.time()) - 60, "height": 0}
        return self.rpc.call(method, *params)

    def call_many(self, method, params):
        return self.rpc.call_many(method, params)

    def churn(self, share: float = 0.01) -> None:
        """`share` of the pool mined or evicted, as many new transactions arrived."""
        txs = self.rpc.txs
        for txid in list(txs)[: int(self.size * share)]:
            del txs[txid]
        for _ in range(int(self.size * share)):
            tx = self.synthetic_block(1, [])["tx"][0]
            tx["txid"] = f"{10**9 + self.replaced:064x}"
            self.replaced += 1
            txs[tx["txid"]] = tx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--until", type=float, required=True, help="epoch seconds to exit at")
    parser.add_argument("--payments-from", type=float, required=True, help="epoch seconds of the first pass")
    parser.add_argument("--payments-every", type=float, required=True)
    parser.add_argument("--lifecycle-at", type=float, required=True, help="epoch seconds of the burst's pass")
    parser.add_argument("--lifecycle-every", type=float, required=True)
    parser.add_argument("--mempool", type=int, default=5000)
    args = parser.parse_args()

    import django

    django.setup()
    from storefront.celery import lower_priority

    niceness = lower_priority()     # as Celery's worker and beat start (JOBS_NICENESS)
    from bip_utils import Bip39SeedGenerator, Bip84, Bip84Coins

    from billing.models import WatcherCursor
    from billing.payments.coins.base import Coin
    from billing.payments.coins.utxo import UtxoAdapter
    from billing.payments.config import use_adapters
    from billing.tasks import watch_payments
    from ops.tasks import lifecycle_tick

    seed = Bip39SeedGenerator("abandon " * 11 + "about").Generate()
    zpub = Bip84.FromSeed(seed, Bip84Coins.BITCOIN).Purpose().Coin().Account(0).PublicKey().ToExtended()
    node = ChainNode(args.mempool)
    adapter = UtxoAdapter(Coin.BTC, zpub, rpc=node, include_mempool=True)
    # The node's chain is at height 0: the watcher's cursor starts there, as bench/payments.py's.
    WatcherCursor.objects.update_or_create(coin="BTC", defaults={"cursor": {"height": 0, "hashes": {"0": "0" * 64}}})
    next_payments, next_lifecycle = args.payments_from, args.lifecycle_at
    print(json.dumps({"job": "ready", "at": time.time(), "pid": os.getpid(), "niceness": niceness}), flush=True)
    with use_adapters({Coin.BTC: adapter}):
        while True:
            now = time.time()
            if now >= args.until:
                break
            due = min(next_payments, next_lifecycle)
            if due > now:
                time.sleep(min(due, args.until) - now)
                continue
            if next_payments <= next_lifecycle:
                job, started = "payments", time.perf_counter()
                result = watch_payments()
                node.churn()
                next_payments += args.payments_every
            else:
                job, started = "lifecycle", time.perf_counter()
                result = lifecycle_tick()
                next_lifecycle += args.lifecycle_every
            print(json.dumps({"job": job, "at": now, "seconds": time.perf_counter() - started, "result": result}),
                  flush=True)


if __name__ == "__main__":
    main()
