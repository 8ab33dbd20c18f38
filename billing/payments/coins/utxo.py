"""BTC and LTC: watch-only addresses and a Core-RPC block-scanning watcher.

Addresses: P2PKH, P2SH-P2WPKH or P2WPKH as the operator's key says — an account key's
SLIP-132 prefix (xpub/ypub/zpub, Ltub/Mtub, tpub/upub/vpub, ttub) or an output descriptor
(``pkh``/``sh(wpkh)``/``wpkh``); see ``keys``. Derivation with bip-utils; no process-global
network parameters are touched.

Detection: ``getblockhash``/``getblock <hash> 2`` from the cursor's height to the tip,
matching each output's address (``scriptPubKey.address``, or the older ``addresses``
list) with a set lookup; plus ``getrawmempool`` + ``getrawtransaction <txid> true`` for
0-confirmation payments, dated by ``getmempoolentry``; a payment that leaves the mempool
unmined is judged with ``gettxout`` on its inputs (double-spent / replaced, or evicted).
No wallet is needed on the node.

Gap limit: see ``gap_warning``.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import urllib.parse
import urllib.request
from decimal import Decimal, localcontext
from typing import Any

from .amounts import format_amount
from .base import COIN_SPECS, Coin, DetectedPayment, ScanResult
from .keys import NETWORKS, parse_receive_key
from .walker import BlockInfo, Found, walk

URI_SCHEMES = {Coin.BTC: "bitcoin", Coin.LTC: "litecoin"}
#: mempool transactions fetched per JSON-RPC batch
MEMPOOL_BATCH = 1000


def gap_warning(highest_used_index: int | None, highest_issued_index: int | None, limit: int = 20) -> bool:
    """True when the operator should be warned about the wallet gap limit.

    Wallets that restore from the xpub (Electrum, Sparrow, BTCPay, Core descriptors) scan
    ahead only ``limit`` (usually 20) addresses past the last one that received funds.
    Every unpaid quote consumes an address, so after ``limit`` unpaid quotes in a row, a
    payment to the next address is invisible in the operator's wallet (the funds are safe
    but need a larger gap limit to show). Warn when the issued addresses run ``limit`` or
    more past the highest used one (``None`` = none used / none issued): raise the wallet's
    gap limit, or let the billing service reuse expired, never-paid quote indexes.
    """
    if highest_issued_index is None:
        return False
    used = -1 if highest_used_index is None else highest_used_index
    return highest_issued_index - used >= limit


class RpcError(RuntimeError):
    def __init__(self, method: str, error: Any):
        self.method = method
        self.error = error
        code = error.get("code") if isinstance(error, dict) else None
        self.code = code
        super().__init__(f"{method}: {error}")


def _json_default(o):
    if isinstance(o, Decimal):  # Core accepts amounts as JSON strings: no float round trip
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


class CoreRpc:
    """Minimal Bitcoin/Litecoin Core JSON-RPC client (urllib, basic auth or cookie file).

    ``url`` may carry ``user:password@``; otherwise ``cookie_file`` (``<datadir>/.cookie``)
    is read on every call (Core rewrites it on restart). Numbers are parsed as ``Decimal``
    so no amount ever passes through a float.
    """

    def __init__(self, url: str, *, cookie_file: str | None = None, timeout: float = 30.0):
        parts = urllib.parse.urlsplit(url)
        self._auth = None
        if parts.username is not None:
            self._auth = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        self.cookie_file = cookie_file
        self.timeout = timeout
        self._ids = itertools.count(1)

    def _auth_header(self) -> str | None:
        if self._auth:
            user, pw = self._auth
        elif self.cookie_file and os.path.exists(self.cookie_file):
            with open(self.cookie_file) as fh:
                user, _, pw = fh.read().strip().partition(":")
        else:
            return None
        return "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()

    def call(self, method: str, *params: Any) -> Any:
        reply = self._post({"jsonrpc": "1.0", "id": next(self._ids), "method": method, "params": list(params)},
                           method)
        if reply.get("error"):
            raise RpcError(method, reply["error"])
        return reply["result"]

    def call_many(self, method: str, params: list[list]) -> list:
        """One JSON-RPC batch (one HTTP request): each call's result, or its ``RpcError``."""
        if not params:
            return []
        ids = [next(self._ids) for _ in params]
        replies = self._post([{"jsonrpc": "1.0", "id": i, "method": method, "params": p}
                              for i, p in zip(ids, params, strict=True)], method)
        by_id = {r.get("id"): r for r in replies}
        return [RpcError(method, by_id[i]["error"]) if by_id[i].get("error") else by_id[i]["result"] for i in ids]

    def _post(self, payload, method: str):
        body = json.dumps(payload, default=_json_default)
        req = urllib.request.Request(self.url, data=body.encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        auth = self._auth_header()
        if auth:
            req.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = resp.read()
        except urllib.error.HTTPError as exc:  # Core answers RPC errors with HTTP 404/500
            data = exc.read()
            if not data:
                raise RpcError(method, {"code": exc.code, "message": str(exc)}) from None
        return json.loads(data, parse_float=Decimal)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *params: self.call(name, *params)


def _coins_to_base(value: Any, decimals: int = 8) -> int:
    if isinstance(value, float):  # only if a caller's RPC parsed floats; go via repr
        value = repr(value)
    with localcontext() as ctx:
        ctx.prec = 60
        d = Decimal(value).scaleb(decimals)
        if d != d.to_integral_value():
            raise ValueError(f"amount {value} has more than {decimals} decimals")
        return int(d)


def _output_address(vout: dict) -> str | None:
    spk = vout.get("scriptPubKey") or {}
    addr = spk.get("address")
    if addr is None:
        addrs = spk.get("addresses")
        if addrs and len(addrs) == 1:
            addr = addrs[0]
    return addr


def match_outputs(txs: list[dict], watch=None) -> list[Found]:
    """Outputs paying a watched address (``watch`` supports ``in``: set or dict; one hash
    lookup per output). ``watch=None`` returns every output that has an address."""
    found = []
    for tx in txs:
        txid = tx["txid"]
        for vout in tx["vout"]:
            addr = _output_address(vout)
            if addr is not None and (watch is None or addr in watch):
                found.append(Found(txid, int(vout["n"]), addr, _coins_to_base(vout["value"])))
    return found


class UtxoAdapter:
    """BTC / LTC adapter: BIP84 addresses, Core-RPC watcher.

    ``network``: ``main``, ``test``, ``signet`` (BTC) or ``regtest``. ``rpc`` is a
    ``CoreRpc`` (or anything with ``call(method, *params)``); None = derivation only.
    ``start_height``: where a watcher with an empty cursor starts (default: the tip).
    """

    def __init__(
        self,
        coin: Coin,
        xpub: str,
        *,
        network: str = "main",
        rpc: Any = None,
        required_confirmations: int | None = None,
        start_height: int | None = None,
        include_mempool: bool = True,
        max_blocks_per_pass: int | None = None,
    ):
        self.coin = Coin(coin)
        if self.coin not in NETWORKS:
            raise ValueError(f"{coin} is not a UTXO coin")
        spec = COIN_SPECS[self.coin]
        self.decimals = spec.decimals
        self.required_confirmations = (
            spec.required_confirmations if required_confirmations is None else required_confirmations
        )
        self.network = network
        self.net = NETWORKS[self.coin][network]
        self._receive = parse_receive_key(xpub, self.coin, self.net)
        self.rpc = rpc
        self.start_height = start_height
        self.include_mempool = include_mempool
        self.max_blocks_per_pass = max_blocks_per_pass
        self._mempool_cache: dict[str, list[Found]] = {}

    # -- addresses and URIs ------------------------------------------------------------
    @property
    def address_type(self) -> str:
        return str(self._receive.type)

    def address_for_index(self, i: int) -> str:
        return self._receive.address(i, self.net)

    def payment_uri(self, address: str, amount_base_units: int, label: str | None = None) -> str:
        """BIP21: ``bitcoin:<addr>?amount=<coins>&label=<label>``."""
        q = [("amount", format_amount(amount_base_units, self.decimals))]
        if label:
            q.append(("label", label))
        return f"{URI_SCHEMES[self.coin]}:{address}?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)

    # -- watcher -----------------------------------------------------------------------
    def _block(self, height: int) -> BlockInfo:
        h = self.rpc.call("getblockhash", height)
        blk = self.rpc.call("getblock", h, 2)
        return BlockInfo(blk["hash"], blk.get("previousblockhash"), match_outputs(blk["tx"], self._watch),
                         int(blk["time"]))

    def scan(self, watch, cursor: dict | None = None, *, max_blocks: int | None = None) -> ScanResult:
        if self.rpc is None:
            raise RuntimeError(f"{self.coin}: no node RPC configured")
        self._watch = watch
        result = walk(
            self.coin,
            cursor or {},
            tip=lambda: self.rpc.call("getblockcount"),
            hash_at=lambda h: self.rpc.call("getblockhash", h),
            block=self._block,
            required=self.required_confirmations,
            start_height=self.start_height,
            max_blocks=max_blocks if max_blocks is not None else self.max_blocks_per_pass,
        )
        if self.include_mempool:
            self._add_mempool(result, watch, dict((cursor or {}).get("pool") or {}))
        return result

    def tip_time(self) -> int | None:
        """Timestamp of the node's best block (how far behind the node is); None without a node."""
        if self.rpc is None:
            return None
        return int(self.rpc.call("getblockheader", self.rpc.call("getbestblockhash"))["time"])

    def _add_mempool(self, result: ScanResult, watch, pool_before: dict) -> None:
        """0-conf payments, dated by the node's mempool entry; the ones of the last pass that
        left the mempool without being mined are judged ``double_spent`` (an input is spent
        elsewhere: a conflict or an RBF replacement) or ``evicted`` — only while the chain
        is still at the height just walked (else a block may hold them: next pass)."""
        tracked = result.cursor["tracked"]
        in_blocks = {(t["txid"], t["n"]) for t in tracked}
        found, current = self._scan_mempool(watch)
        by_tx: dict[str, list[Found]] = {}
        for f in found:
            if (f.txid, f.output_index) not in in_blocks:
                by_tx.setdefault(f.txid, []).append(f)
        pool = {}
        for txid, outputs in by_tx.items():
            entry = pool_before.get(txid) or self._pool_entry(txid)
            if entry is None:  # left the pool between the two calls
                continue
            pool[txid] = {**entry, "outputs": [f.output_index for f in outputs]}
            result.payments.extend(DetectedPayment(self.coin, txid, f.output_index, f.address, f.amount, 0,
                                                   chain_time=entry["time"]) for f in outputs)
        mined = {t["txid"] for t in tracked}
        gone = {t: e for t, e in pool_before.items() if t not in current and t not in mined}
        if gone and self.rpc.call("getblockcount") != result.cursor["height"]:
            pool.update(gone)  # the chain moved since the walk: judge them next pass
        elif gone:
            for txid, entry in gone.items():
                reason = "double_spent" if self._any_input_spent(entry["inputs"]) else "evicted"
                result.dropped.extend((txid, n, reason) for n in entry["outputs"])
        result.cursor["pool"] = pool
        pooled = {(f.txid, f.output_index) for f in found}
        result.reorged = [k for k in result.reorged if k not in pooled]

    def _pool_entry(self, txid: str) -> dict | None:
        try:
            entry = self.rpc.call("getmempoolentry", txid)
            tx = self.rpc.call("getrawtransaction", txid, True)
        except RpcError:
            return None
        return {"time": int(entry["time"]), "inputs": [[i["txid"], i["vout"]] for i in tx["vin"] if "txid" in i]}

    def _any_input_spent(self, inputs: list) -> bool:
        """``gettxout`` with the mempool: None when another transaction spent the output."""
        return any(self.rpc.call("gettxout", txid, n, True) is None for txid, n in inputs)

    def _scan_mempool(self, watch) -> tuple[list[Found], set[str]]:
        """(watched outputs in the mempool, the mempool's txids). Transactions are fetched
        once (cached while they stay in the pool), in JSON-RPC batches when the client can."""
        txids = self.rpc.call("getrawmempool")
        current = set(txids)
        cache = {t: v for t, v in self._mempool_cache.items() if t in current}
        new = [t for t in txids if t not in cache]
        for start in range(0, len(new), MEMPOOL_BATCH):
            chunk = new[start:start + MEMPOOL_BATCH]
            for txid, tx in zip(chunk, self._raw_transactions(chunk), strict=True):
                if not isinstance(tx, RpcError):  # else it left the pool between the two calls
                    cache[txid] = match_outputs([tx])  # all outputs: the watch set may grow later
        self._mempool_cache = cache
        return [f for fs in cache.values() for f in fs if f.address in watch], current

    def _raw_transactions(self, txids: list[str]) -> list:
        if hasattr(self.rpc, "call_many"):
            return self.rpc.call_many("getrawtransaction", [[t, True] for t in txids])
        out = []
        for txid in txids:
            try:
                out.append(self.rpc.call("getrawtransaction", txid, True))
            except RpcError as exc:
                out.append(exc)
        return out
