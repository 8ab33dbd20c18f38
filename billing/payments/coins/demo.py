"""The demo store's coin: the real checkout (quote, address, QR code, watcher, settlement)
with a coin that is worth nothing and lives on no chain.

Its "chain" is a list of transactions kept in the coin's watcher cursor: the demo wallet
(billing.payments.demo.demo_coin_send) appends one, and the watcher's next pass reports it like any
adapter reports a confirmed payment, so the payment is credited by the same code as BTC's.
Addresses and payment URIs say DEMO in clear letters; nothing can be sent to them."""
from __future__ import annotations

import hashlib
from typing import Any

from .base import Coin, DetectedPayment, ScanResult

ADDRESS_PREFIX = "DEMO-NOT-A-REAL-ADDRESS-"


class DemoAdapter:
    coin = Coin.DEMO
    decimals = Coin.DEMO.decimals
    required_confirmations = 1

    def address_for_index(self, i: int) -> str:
        return f"{ADDRESS_PREFIX}{i:06d}"

    def payment_uri(self, address: str, amount_base_units: int, label: str | None = None) -> str:
        return f"demo:{address}?amount={amount_base_units}&note=demo-only-no-value"

    def scan(self, watch: Any, cursor: dict[str, Any]) -> ScanResult:
        chain = list(cursor.get("chain", []))
        payments = [DetectedPayment(coin=Coin.DEMO, txid=tx["txid"], output_index=0, address=tx["address"],
                                    amount=int(tx["amount"]), confirmations=1, block_height=height,
                                    block_hash=tx["txid"], chain_time=tx.get("time"))
                    for height, tx in enumerate(chain, start=1) if tx["address"] in watch]
        return ScanResult(payments=payments, cursor={"chain": chain})


def demo_transaction(*, address: str, amount: int, sequence: int, time: int) -> dict:
    """A demo transaction paying `amount` base units to `address`."""
    txid = hashlib.sha256(f"demo:{address}:{amount}:{sequence}".encode()).hexdigest()
    return {"txid": txid, "address": address, "amount": int(amount), "time": int(time)}
