"""The interface every chain adapter implements, and the values it returns.

Identity of a payment: ``(coin, txid, output_index)`` — the billing models put a database
unique constraint on it, so a payment reported twice (by two watchers, after a restart,
or on every pass until it reaches its confirmations) is credited once.

``output_index`` per chain:

* BTC, LTC: the output's ``vout`` number;
* ERC-20 (USDT, USDC): a 31-bit digest of the transfer's content (token, from, to, value,
  occurrence in the transaction) — stable when a reorg re-mines it at another log index;
* ETH sent by a contract (seen as a balance change): -1, with txid ``<block hash>:<address>``;
* ETH value transfers and SOL: 0 (one payment per transaction and recipient);
* XMR: the subaddress minor index the transfer paid (monero-wallet-rpc reports one
  transfer per transaction and subaddress, so it is unique within the transaction).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class Coin(enum.StrEnum):
    BTC = "BTC"
    LTC = "LTC"
    ETH = "ETH"
    USDT = "USDT"
    USDC = "USDC"
    XMR = "XMR"
    SOL = "SOL"
    #: The demo store's coin (DEMO_PAYMENTS, `make run`): worth nothing, on no chain; its
    #: "chain" is the watcher cursor (coins/demo.py). Never offered with DEMO_PAYMENTS off.
    DEMO = "DEMO"

    @property
    def spec(self) -> CoinSpec:
        return COIN_SPECS[self]

    @property
    def decimals(self) -> int:
        return COIN_SPECS[self].decimals


@dataclass(frozen=True)
class CoinSpec:
    coin: Coin
    name: str
    decimals: int
    base_unit: str
    #: default confirmations before a payment counts as settled (SOL: 1 == finalized)
    required_confirmations: int
    stablecoin: bool = False


COIN_SPECS: dict[Coin, CoinSpec] = {
    Coin.BTC: CoinSpec(Coin.BTC, "Bitcoin", 8, "satoshi", 2),
    Coin.LTC: CoinSpec(Coin.LTC, "Litecoin", 8, "litoshi", 6),
    Coin.ETH: CoinSpec(Coin.ETH, "Ether", 18, "wei", 12),
    Coin.USDT: CoinSpec(Coin.USDT, "Tether USD", 6, "micro-USDT", 12, stablecoin=True),
    Coin.USDC: CoinSpec(Coin.USDC, "USD Coin", 6, "micro-USDC", 12, stablecoin=True),
    Coin.XMR: CoinSpec(Coin.XMR, "Monero", 12, "piconero", 10),
    Coin.SOL: CoinSpec(Coin.SOL, "Solana", 9, "lamport", 1),
    Coin.DEMO: CoinSpec(Coin.DEMO, "Demo coin (no value)", 6, "micro-DEMO", 1, stablecoin=True),
}


@dataclass(frozen=True)
class DetectedPayment:
    """One incoming payment to a watched address, as the chain shows it now.

    ``amount`` is in base units (int). ``confirmations`` is 0 for mempool / pool /
    not-yet-finalized transactions; ``block_hash``/``block_height`` are None then.
    ``chain_time`` (unix seconds): when the chain first showed it — the node's mempool
    entry time, else its block's time; None when the chain does not say (watcher's clock).
    """

    coin: Coin
    txid: str
    output_index: int
    address: str
    amount: int
    confirmations: int
    block_hash: str | None = None
    block_height: int | None = None
    chain_time: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.txid, self.output_index)


@dataclass
class ScanResult:
    """What one watcher pass found.

    ``payments``: new payments and, on later passes, the same payments again with updated
    confirmations until they reach the adapter's ``required_confirmations`` (callers upsert
    on ``(coin, txid, output_index)``).
    ``cursor``: JSON-serialisable state; persist it and pass it to the next ``scan``.
    ``reorged``: ``(txid, output_index)`` of payments reported earlier that have left the
    chain (orphaned block) and were not found again in this pass.
    ``dropped``: ``(txid, output_index, reason)`` of unconfirmed payments that left the
    node's mempool without being mined: ``double_spent`` (an input is spent by another
    transaction: a conflict or an RBF replacement) or ``evicted`` (inputs still unspent).
    """

    payments: list[DetectedPayment] = field(default_factory=list)
    cursor: dict[str, Any] = field(default_factory=dict)
    reorged: list[tuple[str, int]] = field(default_factory=list)
    dropped: list[tuple[str, int, str]] = field(default_factory=list)
    #: deposits that cannot be credited, for the operators: ERC-20 ``Transfer``s of a token
    #: that is not configured, to a watched address ({token, txid, log_index, to, value})
    foreign: list[dict[str, Any]] = field(default_factory=list)
    #: heights ``(after, up_to]`` walked again after a reorg deeper than the walker's memory
    #: (``walker``): a payment recorded in those blocks and not in ``payments`` left the chain
    rewalked: tuple[int, int] | None = None


@runtime_checkable
class CoinAdapter(Protocol):
    coin: Coin
    decimals: int
    required_confirmations: int

    def address_for_index(self, i: int) -> str:
        """Watch-only receive address number ``i`` (per-quote address / subaddress)."""

    def payment_uri(self, address: str, amount_base_units: int, label: str | None = None) -> str:
        """BIP21 / EIP-681 / monero: / Solana Pay URI for the QR code."""

    def scan(self, watch: Any, cursor: dict[str, Any]) -> ScanResult:
        """One watcher pass; ``watch`` is a set of addresses or a dict keyed by address."""
