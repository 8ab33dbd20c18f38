"""ETH and the ERC-20 stablecoins (USDT, USDC) with web3.

Addresses: from the account xpub at ``m/44'/60'/0'`` (what Ledger/Trezor/MetaMask-style
wallets export), receive chain ``0/i``, EIP-55 checksummed.

Detection (both remember the last ~100 block hashes in the cursor to detect reorgs):

* ETH: every block's transactions (``get_block(n, full_transactions=True)``) whose ``to``
  is watched (every address the store gave: a set lookup per transaction), with a successful receipt; ``output_index`` 0. Value sent by a *contract*
  (an internal transfer, e.g. from exchanges or smart-contract wallets) is no transaction
  ``to`` the address: for the addresses ``watch`` flags (a dict; a set: all) it shows as the address's balance growing in the block by more than
  its direct transfers (``eth_getBalance`` at the block vs its parent, by hash); that
  excess is attributed to its transactions by tracing the block (``debug_traceBlockByHash``,
  call tracer): one payment per (transaction, address), txid = the transaction hash,
  index -1 — so a reorg that re-mines the transaction elsewhere does not make it a new
  payment. Excess the trace does not explain is reported, not credited.
  ``Transfer`` logs of tokens that are not configured, to watched addresses, are reported
  (``ScanResult.foreign``) for the operators: such deposits cannot be credited.
* ERC-20: ``Transfer(address,address,uint256)`` logs of the configured token contract
  per block (``eth_getLogs`` by ``blockHash``), filtered on ``topics[2]`` = the watched
  addresses (32-byte padded); ``output_index`` = ``transfer_identity`` of its content
  (token, from, to, value, occurrence in the transaction), not the log index.

Before the first pass the node's chain id must be ``ETH_CHAIN_ID`` and a token's contract
must exist there with the decimals we quote in (``verify_chain``).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from bip_utils import EthAddrEncoder
from web3 import Web3

from .base import COIN_SPECS, Coin, ScanResult
from .keys import parse_account_xpub
from .walker import BlockInfo, Found, walk

DECIMALS_CALL = "0x313ce567"  # decimals()
TRANSFER_TOPIC = "0x" + Web3.keccak(text="Transfer(address,address,uint256)").hex().removeprefix("0x")
EVM_COINS = (Coin.ETH, Coin.USDT, Coin.USDC)
#: above this many watched addresses, logs are filtered here (set lookup) instead of by topic
TOPIC_FILTER_MAX = 500


def _hex(value: Any) -> str:
    if isinstance(value, str):
        return value.lower() if value.startswith("0x") else "0x" + value.lower()
    return "0x" + bytes(value).hex()


def transfer_identity(token: str, sender: str, to: str, value: int, occurrence: int) -> int:
    """A token transfer's ``output_index``: from what it is (token, from, to, value, and which
    such transfer of its transaction), not from where its log landed — a reorg that re-mines
    the transaction elsewhere changes log indexes, not this, so it is credited once."""
    digest = hashlib.sha256(f"{token}:{sender}:{to}:{value}:{occurrence}".lower().encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _log_value(log) -> int:
    data = log["data"]
    return int(data, 16) if isinstance(data, str) else int.from_bytes(bytes(data)[:32], "big")


def address_topic(address: str) -> str:
    return "0x" + "0" * 24 + address.lower().removeprefix("0x")


class EvmAdapter:
    """ETH (no ``token``) or an ERC-20 (``token`` = its contract address) on one chain."""

    def __init__(
        self,
        coin: Coin,
        xpub: str,
        *,
        w3: Web3 | None = None,
        chain_id: int = 1,
        token: str | None = None,
        required_confirmations: int | None = None,
        start_height: int | None = None,
        max_blocks_per_pass: int | None = None,
        known_tokens: tuple[str, ...] = (),
        internal_transfers: bool = True,
    ):
        self.coin = Coin(coin)
        if self.coin not in EVM_COINS:
            raise ValueError(f"{coin} is not an EVM coin")
        if self.coin is not Coin.ETH and not token:
            raise ValueError(f"{coin} needs its token contract address")
        spec = COIN_SPECS[self.coin]
        self.decimals = spec.decimals
        self.required_confirmations = (
            spec.required_confirmations if required_confirmations is None else required_confirmations
        )
        self.w3 = w3
        self.chain_id = int(chain_id)
        self.token = Web3.to_checksum_address(token) if token else None
        self.start_height = start_height
        self.max_blocks_per_pass = max_blocks_per_pass
        self._receive = parse_account_xpub(xpub, None).ChildKey(0)
        self.known_tokens = {t.lower() for t in known_tokens}
        self.internal_transfers = internal_transfers
        self._foreign: list[dict] = []
        self._balance_watch: list[str] = []
        self._verified = False

    def address_for_index(self, i: int) -> str:
        if not 0 <= i < 2**31:
            raise ValueError("index must be a non-hardened index 0 <= i < 2**31")
        return EthAddrEncoder.EncodeKey(self._receive.ChildKey(i).PublicKey().KeyObject())

    def payment_uri(self, address: str, amount_base_units: int, label: str | None = None) -> str:
        """EIP-681. ETH: ``ethereum:<addr>@<chainId>?value=<wei>``; ERC-20:
        ``ethereum:<token>@<chainId>/transfer?address=<to>&uint256=<amount>`` (EIP-681 has
        no label parameter; ``label`` is ignored)."""
        if self.token:
            return (f"ethereum:{self.token}@{self.chain_id}/transfer"
                    f"?address={Web3.to_checksum_address(address)}&uint256={int(amount_base_units)}")
        return f"ethereum:{Web3.to_checksum_address(address)}@{self.chain_id}?value={int(amount_base_units)}"

    # -- watcher -----------------------------------------------------------------------
    def _eth_block(self, height: int, watch_lower: dict[str, str]) -> BlockInfo:
        blk = self.w3.eth.get_block(height, full_transactions=True)
        bhash, parent = _hex(blk["hash"]), _hex(blk["parentHash"])
        found, direct = [], dict.fromkeys(self._balance_watch, 0)
        for tx in blk["transactions"]:
            to = tx.get("to")
            if to is None or tx["value"] == 0:
                continue
            addr = watch_lower.get(to.lower())
            if addr is None:
                continue
            txid = _hex(tx["hash"])
            if self.w3.eth.get_transaction_receipt(txid)["status"] != 1:
                continue  # a reverted transaction moves no value
            found.append(Found(txid, 0, addr, int(tx["value"])))
            if addr in direct:
                direct[addr] += int(tx["value"])
        if self.internal_transfers and height > 0:
            found += self._internal_inflows(bhash, parent, direct)
        self._foreign += self._foreign_transfers(bhash, watch_lower)
        return BlockInfo(bhash, parent, found, int(blk["timestamp"]))

    def _internal_inflows(self, bhash: str, parent: str, direct: dict[str, int]) -> list[Found]:
        """What each watched address received in the block beyond its direct transfers, as
        one payment per (transaction, address) — found by tracing the block's calls, so the
        same transaction re-mined in another block after a reorg is the same payment.
        Value the trace does not explain (a node that cannot trace, a withdrawal) is
        reported for the operators, never credited by itself."""
        excess = {}
        for addr, direct_in in direct.items():
            before = self.w3.eth.get_balance(addr, block_identifier=parent)
            after = self.w3.eth.get_balance(addr, block_identifier=bhash)
            if after - before > direct_in:
                excess[addr] = int(after - before - direct_in)
        if not excess:
            return []
        traced = self._traced_inflows(bhash, {a.lower(): a for a in excess})
        found = [Found(txid, -1, addr, value) for (txid, addr), value in sorted(traced.items())]
        for addr, value in excess.items():
            unexplained = value - sum(v for (_, a), v in traced.items() if a == addr)
            if unexplained > 0:
                self._foreign.append({"token": "ETH", "txid": bhash, "log_index": -1, "to": addr,
                                      "value": str(unexplained), "untraced": True})
        return found

    def _traced_inflows(self, bhash: str, watched: dict[str, str]) -> dict[tuple[str, str], int]:
        """{(tx hash, address): wei} sent to watched addresses by calls inside the block's
        transactions (``debug_traceBlockByHash`` with the call tracer; geth, erigon, anvil);
        reverted calls and everything under them move nothing. {} when the node cannot trace."""
        reply = self.w3.provider.make_request("debug_traceBlockByHash", [bhash, {"tracer": "callTracer"}])
        if not isinstance(reply, dict) or "result" not in reply or not isinstance(reply["result"], list):
            return {}
        out: dict[tuple[str, str], int] = {}

        def visit(frame: dict, txid: str, depth: int) -> None:
            if frame.get("error"):
                return
            to = (frame.get("to") or "").lower()
            value = int(frame.get("value") or "0x0", 16) if isinstance(frame.get("value"), str) else int(
                frame.get("value") or 0)
            if depth > 0 and value and to in watched:
                key = (txid, watched[to])
                out[key] = out.get(key, 0) + value
            for child in frame.get("calls") or []:
                visit(child, txid, depth + 1)

        for item in reply["result"]:
            txid = item.get("txHash")
            if txid and isinstance(item.get("result"), dict):
                visit(item["result"], _hex(txid), 0)
        return out

    def _foreign_transfers(self, bhash: str, watch_lower: dict[str, str]) -> list[dict]:
        """``Transfer``s of any token but ours, to a watched address."""
        topics: list[Any] = [TRANSFER_TOPIC, None]
        if len(watch_lower) <= TOPIC_FILTER_MAX:
            topics.append([address_topic(a) for a in watch_lower])
        out = []
        for log in self.w3.eth.get_logs({"blockHash": bhash, "topics": topics}):
            token = _hex(log["address"])
            to = "0x" + _hex(log["topics"][2])[-40:] if len(log["topics"]) == 3 else None
            if to in watch_lower and token not in self.known_tokens and not log.get("removed"):
                out.append({"token": token, "txid": _hex(log["transactionHash"]), "log_index": int(log["logIndex"]),
                            "to": watch_lower[to], "value": str(_log_value(log))})
        return out

    def _token_block(self, height: int, watch_lower: dict[str, str]) -> BlockInfo:
        blk = self.w3.eth.get_block(height)
        bhash = _hex(blk["hash"])
        topics: list[Any] = [TRANSFER_TOPIC, None]
        if len(watch_lower) <= TOPIC_FILTER_MAX:
            topics.append([address_topic(a) for a in watch_lower])
        logs = self.w3.eth.get_logs({"blockHash": bhash, "address": self.token, "topics": topics})
        found, seen = [], Counter()
        for log in sorted(logs, key=lambda x: int(x["logIndex"])):
            if len(log["topics"]) != 3 or _hex(log["topics"][0]) != TRANSFER_TOPIC or log.get("removed"):
                continue
            to = "0x" + _hex(log["topics"][2])[-40:]
            addr = watch_lower.get(to)
            if addr is None:
                continue
            txid, value = _hex(log["transactionHash"]), _log_value(log)
            content = (self.token.lower(), "0x" + _hex(log["topics"][1])[-40:], to, value)
            seen[txid, content] += 1
            found.append(Found(txid, transfer_identity(*content, seen[txid, content]), addr, value))
        return BlockInfo(bhash, _hex(blk["parentHash"]), found, int(blk["timestamp"]))

    def verify_chain(self) -> None:
        """Refuse to watch the wrong chain: the node's chain id must be ETH_CHAIN_ID, and a
        token's contract must exist there with the decimals we quote in (read from it)."""
        if self._verified:
            return
        node_chain = int(self.w3.eth.chain_id)
        if node_chain != self.chain_id:
            raise ValueError(f"{self.coin}: the node is on chain {node_chain}, ETH_CHAIN_ID is {self.chain_id}")
        if self.token:
            if len(bytes(self.w3.eth.get_code(self.token))) == 0:
                raise ValueError(f"{self.coin}: no contract at {self.token} on chain {self.chain_id}; configure "
                                 f"{self.coin}_CONTRACT for this chain")
            try:
                decimals = int.from_bytes(bytes(self.w3.eth.call({"to": self.token, "data": DECIMALS_CALL})), "big")
            except Exception as exc:
                raise ValueError(f"{self.coin}: {self.token} does not answer decimals(): {exc}") from None
            if decimals != self.decimals:
                raise ValueError(f"{self.coin}: {self.token} has {decimals} decimals on chain {self.chain_id}, "
                                 f"we quote in {self.decimals}")
        self._verified = True

    def scan(self, watch, cursor: dict | None = None, *, max_blocks: int | None = None) -> ScanResult:
        if self.w3 is None:
            raise RuntimeError(f"{self.coin}: no node configured")
        self.verify_chain()
        # one dict per pass so that checksummed and lower-case addresses both match
        watch_lower = {a.lower(): a for a in watch}
        # ETH sent by contracts is found by balance checks per address and block: for the
        # addresses a dict ``watch`` flags (the late-payment window's), all of a set's
        self._balance_watch = [a for a, flag in watch.items() if flag] if isinstance(watch, dict) else list(watch)
        block = self._token_block if self.token else self._eth_block
        self._foreign = []
        result = walk(
            self.coin,
            cursor or {},
            tip=lambda: self.w3.eth.block_number,
            hash_at=lambda h: _hex(self.w3.eth.get_block(h)["hash"]),
            block=lambda h: block(h, watch_lower),
            required=self.required_confirmations,
            start_height=self.start_height,
            max_blocks=max_blocks if max_blocks is not None else self.max_blocks_per_pass,
        )
        result.foreign = self._foreign
        return result

    def tip_time(self) -> int | None:
        """Timestamp of the node's latest block; None without a node."""
        return None if self.w3 is None else int(self.w3.eth.get_block("latest")["timestamp"])

    def confirmed_balance(self, address: str, confirmations: int | None = None) -> int:
        """Balance (wei, or token units) at the block that has ``confirmations``
        (default: required) — the fallback for ETH sent by contracts (internal transfers)."""
        conf = self.required_confirmations if confirmations is None else confirmations
        block = max(self.w3.eth.block_number - conf + 1, 0)
        address = Web3.to_checksum_address(address)
        if self.token:
            data = "0x70a08231" + address_topic(address)[2:]
            raw = self.w3.eth.call({"to": self.token, "data": data}, block_identifier=block)
            return int.from_bytes(bytes(raw), "big")
        return int(self.w3.eth.get_balance(address, block_identifier=block))
