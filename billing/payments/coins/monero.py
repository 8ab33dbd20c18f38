"""XMR through monero-wallet-rpc on a VIEW-ONLY wallet (address + private view key).

One subaddress per quote (``create_address`` in account 0). Detection with
``get_transfers(in=True, pool=True, account_index, subaddr_indices=[...])``: pool
transfers are reported with 0 confirmations, mined ones with the wallet's
``confirmations``.

``output_index`` is the subaddress *minor index* that the transfer paid:
monero-wallet-rpc reports one incoming transfer per (transaction, subaddress) with the
amounts of its outputs summed, so ``(txid, minor index)`` identifies a payment uniquely
and stably across restarts and wallet rescans.

Unlock time: a transfer with a non-zero ``unlock_time`` still in the future (a block
height below 500,000,000, else a Unix time) is not spendable yet; its confirmations are
capped at ``required_confirmations - 1`` until it unlocks, so it stays "processing".
Double-spend-seen pool transfers are ignored. The wallet follows reorgs itself: a
reported, not yet settled transfer that disappears from ``get_transfers`` is reported in
``reorged``.

Settled is not forgotten: a transfer that reached its confirmations stays in the cursor's
``settled`` (with its block height) and is looked for on every pass for
``settled_watch_blocks`` (``XMR_SETTLED_WATCH_BLOCKS``) past its block — Monero has seen
reorgs deeper than its ten confirmations. Gone from the wallet in that window → ``reorged``
(the payment is reversed like any coin's, ``billing.payments.reversals``); back in the pool or
mined again with fewer confirmations → reported again until it has them (a payment back in
the pool keeps counting, as on the other chains, and one that then leaves it unmined is
``dropped``). Past the window it is forgotten.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.parse
import urllib.request
from decimal import Decimal
from typing import Any

from .amounts import format_amount
from .base import COIN_SPECS, Coin, DetectedPayment, ScanResult

#: blocks a settled transfer is still looked for (the default of XMR_SETTLED_WATCH_BLOCKS, ~24 h)
SETTLED_WATCH_BLOCKS = 720


class MoneroRpcError(RuntimeError):
    pass


class MoneroWalletRpc:
    """JSON-RPC 2.0 client for monero-wallet-rpc (``http://host:port/json_rpc``; HTTP digest
    auth when ``user``/``password`` are given, as ``--rpc-login`` requires)."""

    def __init__(self, url: str, *, user: str | None = None, password: str | None = None, timeout: float = 60):
        parts = urllib.parse.urlsplit(url)
        if parts.username is not None and user is None:
            user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        path = parts.path if parts.path not in ("", "/") else "/json_rpc"
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, path, "", ""))
        handlers = []
        if user is not None:
            mgr = urllib.request.HTTPPasswordMgrWithDefaultRealm()
            mgr.add_password(None, self.url, user, password or "")
            handlers.append(urllib.request.HTTPDigestAuthHandler(mgr))
        self._opener = urllib.request.build_opener(*handlers)
        self.timeout = timeout
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": str(next(self._ids)), "method": method, "params": params})
        req = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with self._opener.open(req, timeout=self.timeout) as resp:
            reply = json.loads(resp.read(), parse_float=Decimal)
        if "error" in reply:
            raise MoneroRpcError(f"{method}: {reply['error']}")
        return reply["result"]


def _unlocked(unlock_time: int, height: int, now: float) -> bool:
    if not unlock_time:
        return True
    if unlock_time < 500_000_000:
        return height >= unlock_time
    return now >= unlock_time


class MoneroAdapter:
    coin = Coin.XMR

    def __init__(self, rpc: MoneroWalletRpc, *, account_index: int = 0,
                 required_confirmations: int | None = None, clock=time.time,
                 settled_watch_blocks: int = SETTLED_WATCH_BLOCKS):
        spec = COIN_SPECS[Coin.XMR]
        self.decimals = spec.decimals
        self.required_confirmations = (
            spec.required_confirmations if required_confirmations is None else required_confirmations
        )
        self.rpc = rpc
        self.account_index = account_index
        self._clock = clock
        self.settled_watch_blocks = settled_watch_blocks
        self._index_cache: dict[str, int] = {}

    def create_address(self, label: str | None = None) -> tuple[str, int]:
        """A new subaddress for a quote: ``(address, minor index)``."""
        params: dict[str, Any] = {"account_index": self.account_index}
        if label:
            params["label"] = label
        r = self.rpc.call("create_address", **params)
        self._index_cache[r["address"]] = r["address_index"]
        return r["address"], r["address_index"]

    def create_address_after(self, index: int) -> tuple[str, int]:
        """A new subaddress past minor ``index``: a wallet restored from its keys counts its
        subaddresses from 1 again, and would hand out the addresses of old quotes. The
        subaddresses in between are created in one call (the wallet then also watches them)."""
        first = self.create_address()
        if first[1] > index:
            return first
        r = self.rpc.call("create_address", account_index=self.account_index, count=index - first[1] + 1)
        for address, i in zip(r["addresses"], r["address_indices"], strict=True):
            self._index_cache[address] = i
        return r["addresses"][-1], r["address_indices"][-1]

    def address_for_index(self, i: int) -> str:
        """An existing subaddress (the wallet only knows those it created: use
        ``create_address`` to issue new ones)."""
        r = self.rpc.call("get_address", account_index=self.account_index, address_index=[i])
        for a in r.get("addresses", []):
            if a["address_index"] == i:
                self._index_cache[a["address"]] = i
                return a["address"]
        raise LookupError(f"subaddress {i} not created yet")

    def payment_uri(self, address: str, amount_base_units: int, label: str | None = None) -> str:
        """``monero:<address>?tx_amount=<xmr>&tx_description=<label>``."""
        q = [("tx_amount", format_amount(amount_base_units, self.decimals))]
        if label:
            q.append(("tx_description", label))
        return f"monero:{address}?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)

    def _index_of(self, address: str, hint: Any) -> int:
        if isinstance(hint, int) and not isinstance(hint, bool):
            return hint
        if address not in self._index_cache:
            r = self.rpc.call("get_address_index", address=address)
            if r["index"]["major"] != self.account_index:
                raise ValueError(f"{address} is not in account {self.account_index}")
            self._index_cache[address] = r["index"]["minor"]
        return self._index_cache[address]

    def scan(self, watch, cursor: dict | None = None) -> ScanResult:
        """``watch``: set of subaddresses, or dict subaddress -> minor index (saves a lookup)."""
        cursor = cursor or {}
        hints = watch if isinstance(watch, dict) else dict.fromkeys(watch)
        by_index = {self._index_of(a, h): a for a, h in hints.items()}
        pending: dict[str, int] = dict(cursor.get("pending") or {})
        settled = _settled_heights(cursor.get("settled"))
        if not by_index:
            return ScanResult([], {"pending": pending, "settled": settled}, [])
        self.rpc.call("refresh")
        height = self.rpc.call("get_height")["height"]
        res = self.rpc.call("get_transfers", **{
            "in": True, "pool": True, "account_index": self.account_index,
            "subaddr_indices": sorted(by_index),
        })
        now = self._clock()
        payments: list[DetectedPayment] = []
        present: set[str] = set()
        mined_at: dict[str, int] = {}
        for kind in ("in", "pool"):
            for t in res.get(kind) or []:
                minor = t["subaddr_index"]["minor"]
                if t["subaddr_index"]["major"] != self.account_index or minor not in by_index:
                    continue
                if kind == "pool" and t.get("double_spend_seen"):
                    continue
                key = f"{t['txid']}:{minor}"
                present.add(key)
                conf = 0 if kind == "pool" else int(t.get("confirmations", height - t["height"]))
                if not _unlocked(int(t.get("unlock_time", 0)), height, now):
                    conf = min(conf, self.required_confirmations - 1)
                if kind == "in":
                    mined_at[key] = int(t["height"])
                if key in settled:
                    if conf >= self.required_confirmations:  # still as deep as when it settled
                        settled[key] = mined_at[key]
                        continue
                    del settled[key]  # back in the pool, or re-mined shallower: watched again
                last = pending.get(key)
                if last is not None and last >= self.required_confirmations:
                    continue
                payments.append(DetectedPayment(
                    Coin.XMR, t["txid"], minor, by_index[minor], int(t["amount"]), conf,
                    None, None if kind == "pool" else int(t["height"]),
                    chain_time=int(t["timestamp"]) if t.get("timestamp") else None,
                ))
                pending[key] = conf
        reorged, dropped = [], []
        for key, last in list(pending.items()):
            txid, _, minor_s = key.rpartition(":")
            if int(minor_s) not in by_index:  # no longer watched (quote closed): forget it
                del pending[key]
            elif key not in present:  # left the chain and the pool
                if last == 0:  # never mined: double-spent (the wallet hides those) or dropped
                    dropped.append((txid, int(minor_s), "dropped"))
                elif last < self.required_confirmations:
                    reorged.append((txid, int(minor_s)))
                del pending[key]
        for key, mined in list(settled.items()):
            txid, _, minor_s = key.rpartition(":")
            if int(minor_s) not in by_index or (mined is not None and height - mined > self.settled_watch_blocks):
                del settled[key]  # no longer watched, or past the window: forgotten
            elif key not in present:
                if mined is not None:  # settled, and now gone from the chain: a reorg deeper than its confirmations
                    reorged.append((txid, int(minor_s)))
                del settled[key]  # (a cursor from before heights were kept: unknown, not judged)
        for key, conf in list(pending.items()):
            if conf >= self.required_confirmations and key in mined_at:
                settled[key] = mined_at[key]
                del pending[key]
        new_cursor = {"pending": pending, "settled": settled}
        return ScanResult(payments, new_cursor, sorted(reorged), sorted(dropped))


def _settled_heights(saved) -> dict[str, int | None]:
    """The cursor's settled transfers → their block heights; a cursor written before the
    heights were kept holds a list of keys (height unknown until the wallet shows it again)."""
    if isinstance(saved, dict):
        return {k: (int(v) if v is not None else None) for k, v in saved.items()}
    return dict.fromkeys(saved or ())
