"""SOL by Solana Pay: one merchant address, a fresh *reference* key per quote.

The reference is 32 random bytes in base58 (only an identifier: no keypair, nothing to
keep secret). The wallet adds it as a read-only account key to the transfer; we find the
transaction with ``getSignaturesForAddress(reference)`` and validate it like Solana Pay's
``validateTransfer``: no error, the reference among the account keys, and the merchant's
balance change (``postBalances - preBalances`` at its account index) positive; the
change is the payment's amount (the caller compares it with the quote: partial, exact,
over). Versioned transactions' loaded addresses are included in the account keys.

Uniform interface: for SOL the quote's "address" IS its reference —
``address_for_index`` returns a new random reference (the index is not used: references
are not derived), ``payment_uri(reference, amount)`` builds
``solana:<merchant>?amount=<sol>&reference=<reference>&label=...``, ``scan`` takes the
references to watch, and ``DetectedPayment.address`` is the reference. ``output_index``
is 0 and ``txid`` the transaction signature.

Confirmations: 1 once the signature is *finalized* (``required_confirmations`` = 1),
0 while only confirmed (reported only with ``report_unfinalized=True``, which queries at
``confirmed`` commitment; by default the query is at ``finalized``). One
``getSignaturesForAddress`` call per watched reference per pass (Solana Pay's model) for
the quotes of the window; ``watch`` maps every quote's reference to whether it is in the
window (as for EVM addresses).

A payment after the window is recorded too: each pass also reads the merchant address's
finalized signatures since the newest one it read last time (paged, at most
``MERCHANT_PAGES`` pages a pass; the rest on the next), and a transfer whose account keys
hold the reference of a quote outside the window is reported for it — the store then
records it and an operator decides (an ``after_window`` review).
"""

from __future__ import annotations

import itertools
import json
import secrets
import urllib.parse
import urllib.request
from typing import Any

from .amounts import format_amount
from .base import COIN_SPECS, Coin, DetectedPayment, ScanResult

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
MERCHANT_PAGES = 10        # pages of the merchant's signatures read per pass (a backlog takes passes)
MERCHANT_PAGE_SIZE = 100


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def b58decode(text: str) -> bytes:
    n = 0
    for ch in text:
        n = n * 58 + _B58.index(ch)
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def new_reference() -> str:
    return b58encode(secrets.token_bytes(32))


def is_public_key(text: str) -> bool:
    try:
        return len(b58decode(text)) == 32
    except ValueError:
        return False


class SolanaRpcError(RuntimeError):
    pass


class SolanaRpc:
    def __init__(self, url: str, timeout: float = 30):
        self.url = url
        self.timeout = timeout
        self._ids = itertools.count(1)

    def call(self, method: str, *params: Any) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": list(params)})
        req = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            reply = json.loads(resp.read())
        if reply.get("error"):
            raise SolanaRpcError(f"{method}: {reply['error']}")
        return reply["result"]


def account_keys(tx: dict) -> list[str]:
    msg = tx["transaction"]["message"]
    keys = [k if isinstance(k, str) else k["pubkey"] for k in msg["accountKeys"]]
    loaded = (tx.get("meta") or {}).get("loadedAddresses") or {}
    return keys + list(loaded.get("writable", [])) + list(loaded.get("readonly", []))


def validate_transfer(tx: dict | None, merchant: str, reference: str) -> int | None:
    """The lamports ``merchant`` received in ``tx`` if it is a valid Solana Pay transfer
    carrying ``reference``; None otherwise."""
    if not tx or not tx.get("meta") or tx["meta"].get("err") is not None:
        return None
    keys = account_keys(tx)
    if reference not in keys or merchant not in keys:
        return None
    i = keys.index(merchant)
    meta = tx["meta"]
    delta = int(meta["postBalances"][i]) - int(meta["preBalances"][i])
    return delta if delta > 0 else None


class SolanaAdapter:
    coin = Coin.SOL

    def __init__(self, merchant: str, rpc: SolanaRpc | None = None, *, report_unfinalized: bool = False,
                 signatures_limit: int = 25):
        if not is_public_key(merchant):
            raise ValueError("SOL merchant address must be a base58 32-byte public key")
        self.merchant = merchant
        self.rpc = rpc
        self.decimals = COIN_SPECS[Coin.SOL].decimals
        self.required_confirmations = 1
        self.report_unfinalized = report_unfinalized
        self.signatures_limit = signatures_limit

    def address_for_index(self, i: int) -> str:
        """A fresh random reference for a quote (``i`` is not used: see the module doc)."""
        return new_reference()

    def payment_uri(self, address: str, amount_base_units: int, label: str | None = None) -> str:
        """Solana Pay transfer request; ``address`` is the quote's reference."""
        q = [("amount", format_amount(amount_base_units, self.decimals)), ("reference", address)]
        if label:
            q.append(("label", label))
        return f"solana:{self.merchant}?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)

    def scan(self, watch, cursor: dict | None = None) -> ScanResult:
        cursor = cursor or {}
        final: set[str] = set(cursor.get("final") or ())
        pending: dict[str, str] = dict(cursor.get("pending") or {})  # signature -> reference
        commitment = "confirmed" if self.report_unfinalized else "finalized"
        payments: list[DetectedPayment] = []
        present: set[str] = set()
        in_window = [ref for ref in watch if not isinstance(watch, dict) or watch[ref]]
        for ref in in_window:
            sigs = self.rpc.call("getSignaturesForAddress", ref,
                                 {"commitment": commitment, "limit": self.signatures_limit})
            for s in sigs:
                sig = s["signature"]
                present.add(sig)
                if sig in final or s.get("err") is not None:
                    continue
                is_final = s.get("confirmationStatus") == "finalized"
                tx = self.rpc.call("getTransaction", sig, {
                    "commitment": commitment, "encoding": "json", "maxSupportedTransactionVersion": 0})
                amount = validate_transfer(tx, self.merchant, ref)
                if amount is None:
                    final.add(sig)  # not a valid payment; never look at it again
                    continue
                payments.append(DetectedPayment(
                    Coin.SOL, sig, 0, ref, amount, 1 if is_final else 0,
                    None, int(tx.get("slot", s.get("slot", 0))) if is_final else None))
                if is_final:
                    final.add(sig)
                    pending.pop(sig, None)
                else:
                    pending[sig] = ref
        watched = set(in_window)
        reorged = sorted((sig, 0) for sig, ref in pending.items() if ref in watched and sig not in present)
        pending = {sig: ref for sig, ref in pending.items() if ref in watched and sig in present}
        new_cursor = {"final": sorted(final)[-5000:], "pending": pending}
        if isinstance(watch, dict):
            outside = {ref for ref, window in watch.items() if not window}
            payments.extend(self._after_the_window(outside, cursor, new_cursor, final))
            new_cursor["final"] = sorted(final)[-5000:]
        return ScanResult(payments, new_cursor, reorged)

    def _after_the_window(self, outside: set[str], cursor: dict, new_cursor: dict,
                          final: set[str]) -> list[DetectedPayment]:
        """Finalized transfers to the merchant since the last pass that carry the reference of
        a quote outside the window. The cursor keeps the newest signature read
        (``merchant_until``); a backlog deeper than MERCHANT_PAGES pages goes on below where
        it stopped (``merchant_before``) on the next passes. The first pass starts from now."""
        until, before = cursor.get("merchant_until"), cursor.get("merchant_before")
        newest = cursor.get("merchant_newest") if before else None
        found: list[DetectedPayment] = []
        for _ in range(MERCHANT_PAGES):
            options: dict[str, Any] = {"commitment": "finalized", "limit": MERCHANT_PAGE_SIZE}
            options.update({k: v for k, v in (("until", until), ("before", before)) if v})
            sigs = self.rpc.call("getSignaturesForAddress", self.merchant, options)
            newest = newest or (sigs[0]["signature"] if sigs else None)
            if not sigs or until is None:  # nothing new, or the first pass: from now on
                before = None
                break
            for s in sigs:
                if s["signature"] not in final and s.get("err") is None:
                    found.extend(self._late_transfer(s, outside, final))
            before = sigs[-1]["signature"] if len(sigs) == MERCHANT_PAGE_SIZE else None
            if before is None:
                break
        if before is None:   # read down to the last bound: the next pass starts above the newest
            new_cursor["merchant_until"] = newest or until
        else:                # a backlog: the next pass goes on below `before`
            new_cursor.update(merchant_until=until, merchant_before=before, merchant_newest=newest)
        return found

    def _late_transfer(self, info: dict, outside: set[str], final: set[str]) -> list[DetectedPayment]:
        sig = info["signature"]
        tx = self.rpc.call("getTransaction", sig, {
            "commitment": "finalized", "encoding": "json", "maxSupportedTransactionVersion": 0})
        for ref in outside.intersection(account_keys(tx) if tx else ()):
            amount = validate_transfer(tx, self.merchant, ref)
            if amount is not None:
                final.add(sig)
                return [DetectedPayment(Coin.SOL, sig, 0, ref, amount, 1, None,
                                        int(tx.get("slot", info.get("slot", 0))))]
        return []
