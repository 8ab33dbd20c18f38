"""SOL (Solana Pay) against a local JSON-RPC HTTP server answering getSignaturesForAddress /
getTransaction with responses shaped as Solana's RPC documentation shows (there is no
local validator on this machine)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from billing.payments.coins.solana import (
    SolanaAdapter,
    SolanaRpc,
    b58decode,
    b58encode,
    new_reference,
)

MERCHANT = b58encode(bytes(range(1, 33)))
PAYER = b58encode(bytes(range(2, 34)))
SYSTEM = "11111111111111111111111111111111"


class FakeSolana:
    def __init__(self):
        self.sigs: dict[str, list[dict]] = {}  # reference -> signature infos (newest first)
        self.txs: dict[str, dict] = {}
        self.calls: list[str] = []

    def pay(self, sig, reference, lamports, *, status="finalized", err=None, slot=100, v0=False,
            merchant=MERCHANT):
        keys = [PAYER, merchant, SYSTEM] + ([] if v0 else [reference])
        pre = [5_000_000_000, 1_000_000_000, 1, 0]
        post = [pre[0] - lamports - 5000, pre[1] + lamports, 1, 0]
        self.txs[sig] = {
            "slot": slot, "blockTime": 1_700_000_000, "version": 0 if v0 else "legacy",
            "meta": {"err": err, "fee": 5000, "preBalances": pre[: len(keys) + (1 if v0 else 0)],
                     "postBalances": post[: len(keys) + (1 if v0 else 0)], "innerInstructions": [],
                     "logMessages": [], "preTokenBalances": [], "postTokenBalances": [], "rewards": [],
                     "status": {"Ok": None} if err is None else {"Err": err},
                     **({"loadedAddresses": {"writable": [], "readonly": [reference]}} if v0 else {})},
            "transaction": {"signatures": [sig], "message": {
                "accountKeys": keys, "header": {"numRequiredSignatures": 1, "numReadonlySignedAccounts": 0,
                                                "numReadonlyUnsignedAccounts": 2},
                "instructions": [{"programIdIndex": 2, "accounts": [0, 1] + ([] if v0 else [3]),
                                  "data": "3Bxs4h24hBtQy9rw"}],
                "recentBlockhash": "EETubP5AKHgjPAhzPAFcb8BAY1hMH639CWCFTqi3hq1k"}},
        }
        info = {"signature": sig, "slot": slot, "err": err, "memo": None, "blockTime": 1_700_000_000,
                "confirmationStatus": status}
        for key in {reference, merchant}:  # every account of the transaction lists it
            self.sigs.setdefault(key, []).insert(0, info)

    def answer(self, req):
        method, params = req["method"], req["params"]
        self.calls.append(method)
        if method == "getSignaturesForAddress":
            ref, opts = params[0], params[1]
            order = {"processed": 0, "confirmed": 1, "finalized": 2}
            infos = [s for s in self.sigs.get(ref, [])
                     if order[s["confirmationStatus"]] >= order[opts.get("commitment", "finalized")]]
            names = [s["signature"] for s in infos]  # newest first: `before` and `until` cut it
            if opts.get("before") in names:
                infos = infos[names.index(opts["before"]) + 1:]
            names = [s["signature"] for s in infos]
            if opts.get("until") in names:
                infos = infos[:names.index(opts["until"])]
            return infos[: opts.get("limit", 1000)]
        if method == "getTransaction":
            return self.txs.get(params[0])
        raise AssertionError(method)


@pytest.fixture
def solana():
    fake = FakeSolana()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": fake.answer(req)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()


def test_base58_roundtrip_and_reference():
    ref = new_reference()
    assert len(b58decode(ref)) == 32 and b58encode(b58decode(ref)) == ref
    assert b58encode(b"\0\0\x01") == "112"
    assert b58encode(bytes(32)) == SYSTEM


def test_uri():
    a = SolanaAdapter(MERCHANT)
    ref = a.address_for_index(0)
    assert a.payment_uri(ref, 1_500_000_000, "GPU lease #4") == (
        f"solana:{MERCHANT}?amount=1.5&reference={ref}&label=GPU%20lease%20%234")


def test_finalized_payment_validated_and_reported_once(solana):
    a = SolanaAdapter(MERCHANT, SolanaRpc(solana.url))
    ref, other = new_reference(), new_reference()
    solana.pay("sigA", ref, 250_000_000)
    solana.pay("sigB", other, 1)  # someone else's quote, not watched
    r = a.scan({ref}, {})
    assert [(p.txid, p.output_index, p.address, p.amount, p.confirmations) for p in r.payments] == [
        ("sigA", 0, ref, 250_000_000, 1)]
    r2 = a.scan({ref}, json.loads(json.dumps(r.cursor)))
    assert r2.payments == [] and solana.calls.count("getTransaction") == 1


def test_partial_then_complete_and_v0_loaded_reference(solana):
    a = SolanaAdapter(MERCHANT, SolanaRpc(solana.url))
    ref = new_reference()
    solana.pay("part1", ref, 100)
    r = a.scan({ref}, {})
    solana.pay("part2", ref, 900, v0=True)
    r = a.scan({ref}, r.cursor)
    assert [(p.txid, p.amount) for p in r.payments] == [("part2", 900)]


def test_invalid_transfers_are_rejected(solana):
    a = SolanaAdapter(MERCHANT, SolanaRpc(solana.url))
    ref = new_reference()
    solana.pay("failed", ref, 500, err={"InstructionError": [0, "Custom"]})
    solana.pay("elsewhere", ref, 500, merchant=PAYER)  # pays a different recipient
    assert a.scan({ref}, {}).payments == []


def test_unfinalized_seen_then_finalized_or_dropped(solana):
    a = SolanaAdapter(MERCHANT, SolanaRpc(solana.url), report_unfinalized=True)
    ref = new_reference()
    solana.pay("s1", ref, 700, status="confirmed")
    r = a.scan({ref}, {})
    assert [(p.txid, p.confirmations) for p in r.payments] == [("s1", 0)]
    # not finalized by default: the finalized-only watcher does not report it yet
    assert SolanaAdapter(MERCHANT, SolanaRpc(solana.url)).scan({ref}, {}).payments == []
    solana.sigs[ref][0]["confirmationStatus"] = "finalized"
    r2 = a.scan({ref}, r.cursor)
    assert [(p.txid, p.confirmations) for p in r2.payments] == [("s1", 1)]
    # a confirmed-but-never-finalized payment that vanishes (fork) is reported as reorged
    solana.pay("s2", ref, 50, status="confirmed")
    r3 = a.scan({ref}, r2.cursor)
    solana.sigs[ref] = [s for s in solana.sigs[ref] if s["signature"] != "s2"]
    r4 = a.scan({ref}, r3.cursor)
    assert r4.reorged == [("s2", 0)]


def test_a_payment_to_a_reference_outside_the_window_is_found_on_the_merchant_address(solana, monkeypatch):
    """Quotes outside the window are not asked for one by one; the merchant address's new
    transfers are read instead (from the first pass on, paged), and one carrying such a
    quote's reference is reported for it, once."""
    import billing.payments.coins.solana as solana_module

    monkeypatch.setattr(solana_module, "MERCHANT_PAGE_SIZE", 2)
    monkeypatch.setattr(solana_module, "MERCHANT_PAGES", 2)
    a = SolanaAdapter(MERCHANT, SolanaRpc(solana.url))
    old, current = new_reference(), new_reference()
    solana.pay("before-the-first-pass", old, 5)
    r = a.scan({old: False, current: True}, {})
    assert r.payments == []                        # the first pass starts from now
    for n in range(5):                             # a backlog of 5: pages of 2, 2 pages a pass
        solana.pay(f"other-{n}", new_reference(), 1)
    solana.pay("late", old, 300_000_000)
    solana.pay("in-window", current, 7)
    calls = len(solana.calls)
    r = a.scan({old: False, current: True}, r.cursor)
    assert [(p.txid, p.address, p.amount, p.confirmations) for p in r.payments] == [
        ("in-window", current, 7, 1), ("late", old, 300_000_000, 1)]
    assert solana.calls[calls:].count("getSignaturesForAddress") == 3   # the window's one + 2 pages
    r = a.scan({old: False, current: True}, r.cursor)                   # the rest of the backlog
    assert r.payments == [] and "merchant_before" not in r.cursor
    solana.pay("later", old, 9)
    r = a.scan({old: False, current: True}, r.cursor)                   # above the last newest
    assert [(p.txid, p.amount) for p in r.payments] == [("later", 9)]
    assert a.scan({old: False, current: True}, r.cursor).payments == []


def test_sol_payment_to_a_quote_long_after_its_late_window_is_recorded_for_an_operator(
        solana, catalog, customer, operator, settings):
    """As for LTC on litecoind (tests/billing/payments/test_adversarial_chains.py): 8 days after the order
    (past LATE_PAYMENT_WATCH_DAYS = 7) the customer pays the old reference again. The watcher
    finds it on the merchant address: recorded, and a review waits for an operator; nothing
    is credited by itself."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import LedgerEntry, Payment, PaymentReview
    from billing.payments import config as coins_config
    from billing.payments.coins.base import Coin
    from billing.payments.services import quote_create, watch_coin
    from tests.billing.payments_helpers import set_rate
    from tests.factories import order

    settings.LATE_PAYMENT_WATCH_DAYS = 7
    now = timezone.now()
    set_rate("SOL", "100", now)
    with coins_config.use_adapters({Coin.SOL: SolanaAdapter(MERCHANT, SolanaRpc(solana.url))}):
        _, invoice = order(customer, now, pay=False)
        quote = quote_create(invoice=invoice, coin="SOL", now=now)
        watch_coin(coin="SOL", now=now)
        solana.pay("paid", quote.reference, int(quote.amount))
        watch_coin(coin="SOL", now=now + timedelta(minutes=1))
        later = now + timedelta(days=8)
        set_rate("SOL", "90", later)
        watch_coin(coin="SOL", now=later)
        solana.pay("again", quote.reference, 200_000_000)
        watch_coin(coin="SOL", now=later + timedelta(minutes=1))
        watch_coin(coin="SOL", now=later + timedelta(minutes=2))  # one review

    assert invoice.__class__.objects.get(pk=invoice.pk).state == "paid"
    payment = Payment.objects.get(txid="again")
    assert payment.state == Payment.State.CONFIRMED and payment.quote_id == quote.pk
    review = PaymentReview.objects.get()
    assert (review.kind, review.state, review.payment_id, review.proposed_cents) == (
        "after_window", "open", payment.pk, None)
    assert not LedgerEntry.objects.filter(kind="late_payment").exists()
