"""Unit tests: derivation vectors, amounts (Decimal, rounded up), URIs, rates, gap limit,
registry, and the block walker against an in-memory chain."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from bip_utils import Base58Decoder, Base58Encoder
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing.payments.coins import (
    COIN_SPECS,
    Coin,
    CoinAdapter,
    PegRates,
    Rate,
    StaleRateError,
    StaticRates,
    format_amount,
    is_stale,
    usd_cents_to_base_units,
)
from billing.payments.coins.amounts import parse_amount
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.keys import parse_account_xpub
from billing.payments.coins.rates import ChainedRates, RateUnavailable, require_fresh
from billing.payments.coins.registry import build_adapters
from billing.payments.coins.utxo import UtxoAdapter, gap_warning, match_outputs

ZPUB = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs"
ETH_XPUB = "xpub6DCoCpSuQZB2jawqnGMEPS63ePKWkwWPH4TU45Q7LPXWuNd8TMtVxRrgjtEshuqpK3mdhaWHPFsBngh5GFZaM6si3yZdUsT8ddYM3PwnATt"
# BIP84 test vectors for the "abandon ... about" mnemonic, account 0 (from the BIP)
BIP84_VECTORS = {0: "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu", 1: "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"}
# the same mnemonic's Litecoin account m/84'/2'/0' (zpub version as bip-utils exports it)
LTC_ZPUB = "zpub6rPo5mF47z5coVm5rvWv7fv181awb7Vckn5Cf3xQXBVKu18kuBHDhNi1Jrb4br6vVD3ZbrnXemEsWJoR18mZwkUdzwD8TQnHDUCGxqZ6swA"


def reversion(key: str, version_hex: str) -> str:
    return Base58Encoder.CheckEncode(bytes.fromhex(version_hex) + Base58Decoder.CheckDecode(key)[4:])


# -- derivation --------------------------------------------------------------------------
def test_bip84_vectors():
    a = UtxoAdapter(Coin.BTC, ZPUB)
    for i, addr in BIP84_VECTORS.items():
        assert a.address_for_index(i) == addr


def test_prefix_names_the_address_type_and_descriptors_override_it():
    """A BIP44 xpub is P2PKH, a ypub P2SH-P2WPKH, a zpub P2WPKH (never silently BIP84)."""
    xpub, ypub = reversion(ZPUB, "0488b21e"), reversion(ZPUB, "049d7cb2")
    legacy = UtxoAdapter(Coin.BTC, xpub).address_for_index(1)
    nested = UtxoAdapter(Coin.BTC, ypub).address_for_index(1)
    assert legacy.startswith("1") and nested.startswith("3")
    assert UtxoAdapter(Coin.BTC, f"wpkh({xpub}/0/*)").address_for_index(1) == BIP84_VECTORS[1]
    assert UtxoAdapter(Coin.BTC, f"pkh([73c5da0a/44'/0'/0']{xpub}/0/*)#abcdefgh").address_for_index(1) == legacy
    assert UtxoAdapter(Coin.BTC, f"sh(wpkh({xpub}/0/*))").address_for_index(1) == nested
    # the same key on regtest under vpub: same hash160, bcrt hrp
    reg = UtxoAdapter(Coin.BTC, reversion(ZPUB, "045f1cf6"), network="regtest").address_for_index(0)
    from bitcoin.segwit_addr import decode

    assert reg.startswith("bcrt1q")
    assert decode("bcrt", reg) == decode("bc", BIP84_VECTORS[0])  # same witness program


def test_ltc_prefixes():
    ltub, mtub = reversion(LTC_ZPUB, "019da462"), reversion(LTC_ZPUB, "01b26ef6")
    assert UtxoAdapter(Coin.LTC, LTC_ZPUB).address_for_index(0).startswith("ltc1q")
    assert UtxoAdapter(Coin.LTC, ltub).address_for_index(0).startswith("L")
    assert UtxoAdapter(Coin.LTC, mtub).address_for_index(0).startswith("M")
    assert UtxoAdapter(Coin.LTC, f"wpkh({ltub}/0/*)").address_for_index(0) == UtxoAdapter(
        Coin.LTC, LTC_ZPUB).address_for_index(0)
    ttub = reversion(LTC_ZPUB, "0436f6e1")
    assert UtxoAdapter(Coin.LTC, f"wpkh({ttub}/0/*)", network="test").address_for_index(0).startswith("tltc1q")


def test_refuses_private_wrong_network_other_coin_multisig_and_wrong_depth():
    with pytest.raises(ValueError, match="PRIVATE"):
        parse_account_xpub("xprv9s21ZrQH143K3GJpoapnV8SFfukcVBSfeCficPSGfubmSFDxo1kuHnLisriDvSnRRuL2Qrg5ggqHKNVpxR86QEC8w35uxmGoggxtQTPvfUu", True)
    with pytest.raises(ValueError, match="testnet"):
        UtxoAdapter(Coin.BTC, reversion(ZPUB, "045f1cf6"), network="main")
    with pytest.raises(ValueError, match="mainnet"):
        UtxoAdapter(Coin.LTC, LTC_ZPUB, network="regtest")
    with pytest.raises(ValueError, match="a LTC key was given for BTC"):
        UtxoAdapter(Coin.BTC, reversion(LTC_ZPUB, "019da462"))
    with pytest.raises(ValueError, match="a LTC key was given for BTC"):
        UtxoAdapter(Coin.BTC, f"wpkh({reversion(LTC_ZPUB, '01b26ef6')}/0/*)")
    with pytest.raises(ValueError, match="multisig"):
        UtxoAdapter(Coin.BTC, reversion(ZPUB, "02aa7ed3"))
    with pytest.raises(ValueError, match="unsupported descriptor"):
        UtxoAdapter(Coin.BTC, f"tr({ZPUB}/0/*)")
    from bip_utils import Bip32Secp256k1

    master_pub = Bip32Secp256k1.FromSeed(bytes(32)).PublicKey().ToExtended()
    with pytest.raises(ValueError, match="depth"):
        UtxoAdapter(Coin.BTC, master_pub)
    assert UtxoAdapter(Coin.BTC, f"pkh({master_pub}/44/0/0/*)").address_for_index(0).startswith("1")


def test_eth_derivation_checksummed():
    a = EvmAdapter(Coin.ETH, ETH_XPUB)
    assert a.address_for_index(0) == "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"
    assert a.address_for_index(1) != a.address_for_index(0)


def test_adapters_satisfy_protocol():
    assert isinstance(UtxoAdapter(Coin.BTC, ZPUB), CoinAdapter)
    assert isinstance(EvmAdapter(Coin.ETH, ETH_XPUB), CoinAdapter)


# -- amounts -------------------------------------------------------------------------------
def test_specs():
    assert {c: s.decimals for c, s in COIN_SPECS.items()} == {
        Coin.BTC: 8, Coin.LTC: 8, Coin.ETH: 18, Coin.USDT: 6, Coin.USDC: 6, Coin.XMR: 12, Coin.SOL: 9,
        Coin.DEMO: 6}  # the demo store's coin (DEMO_PAYMENTS only)
    # Confirmation counts are tested by behaviour in tests/billing/payments/test_confirmations.py.


def test_usd_to_base_units_rounds_up():
    # $10.00 at $30,000/BTC = 0.000333333.. BTC -> 33334 sat (up, never down)
    assert usd_cents_to_base_units(1000, 30000, coin=Coin.BTC) == 33334
    assert usd_cents_to_base_units(1000, Decimal("25000"), coin="BTC") == 40000  # exact stays exact
    assert usd_cents_to_base_units(1, "3000.17", coin=Coin.ETH) == 3333144455148  # 1e18/300017 = ...147.5 -> up
    assert usd_cents_to_base_units(1999, coin=Coin.USDT) == 19_990_000
    assert usd_cents_to_base_units(1999, coin=Coin.USDC, peg=Decimal("0.999")) == 20_010_011
    assert usd_cents_to_base_units(0, 100, coin=Coin.SOL) == 0


def test_amounts_refuse_floats_and_bad_input():
    with pytest.raises(TypeError):
        usd_cents_to_base_units(1000, 30000.0, coin=Coin.BTC)
    with pytest.raises(TypeError):
        usd_cents_to_base_units(10.0, 30000, coin=Coin.BTC)
    with pytest.raises(ValueError):
        usd_cents_to_base_units(100, 0, coin=Coin.BTC)
    with pytest.raises(ValueError):
        usd_cents_to_base_units(100, coin=Coin.BTC)  # no rate for a non-stablecoin


@hsettings(deadline=None)  # no deadline: a loaded CI machine stalls past hypothesis's 200 ms
@given(cents=st.integers(0, 10**9), rate=st.decimals(min_value=Decimal("0.0001"), max_value=Decimal(10**7), places=4))
def test_rounding_up_property(cents, rate):
    units = usd_cents_to_base_units(cents, rate, decimals=8)
    value_cents = Decimal(units) * rate / Decimal(10**8) * 100
    assert value_cents >= cents  # never below the price
    assert (Decimal(units - 1) * rate / Decimal(10**8) * 100 < cents) or units == 0  # and minimal


@hsettings(deadline=None)
@given(st.integers(0, 10**30), st.sampled_from([0, 6, 8, 9, 12, 18]))
def test_format_amount_exact_roundtrip(units, decimals):
    text = format_amount(units, decimals)
    assert "e" not in text.lower()
    assert parse_amount(text, decimals) == units


def test_format_amount_examples():
    assert format_amount(1500, 8) == "0.000015"
    assert format_amount(100_000_000, 8) == "1"
    assert format_amount(1, 18) == "0.000000000000000001"
    assert format_amount(-5, 2) == "-0.05"


# -- URIs ---------------------------------------------------------------------------------
def test_bip21_uris():
    btc = UtxoAdapter(Coin.BTC, ZPUB)
    assert btc.payment_uri(BIP84_VECTORS[0], 33334) == f"bitcoin:{BIP84_VECTORS[0]}?amount=0.00033334"
    ltc = UtxoAdapter(Coin.LTC, LTC_ZPUB)
    addr = ltc.address_for_index(0)
    assert ltc.payment_uri(addr, 100_000_000, "Invoice 7 & co") == f"litecoin:{addr}?amount=1&label=Invoice%207%20%26%20co"


def test_eip681_uris():
    eth = EvmAdapter(Coin.ETH, ETH_XPUB, chain_id=1)
    to = eth.address_for_index(0)
    assert eth.payment_uri(to.lower(), 10**17) == f"ethereum:{to}@1?value=100000000000000000"
    usdt_addr = "0xdAC17F958D2ee523a2206206994597C13D831ec7"
    usdt = EvmAdapter(Coin.USDT, ETH_XPUB, chain_id=1, token=usdt_addr.lower())
    assert usdt.payment_uri(to, 25_000_000) == f"ethereum:{usdt_addr}@1/transfer?address={to}&uint256=25000000"


def test_monero_uri():
    from billing.payments.coins.monero import MoneroAdapter

    assert MoneroAdapter(rpc=None).payment_uri("4Addr", 1_000_000_000, "q 1") == "monero:4Addr?tx_amount=0.001&tx_description=q%201"


# -- rates ---------------------------------------------------------------------------------
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_static_and_peg_rates_and_staleness():
    rates = ChainedRates(PegRates({"USDC": "0.999"}, clock=lambda: NOW),
                         StaticRates({"BTC": ("30000", NOW - timedelta(minutes=5))}))
    r = rates.rate(Coin.BTC)
    assert r == Rate(Coin.BTC, Decimal(30000), "operator", NOW - timedelta(minutes=5))
    assert not is_stale(r, NOW, timedelta(minutes=15))
    assert is_stale(r, NOW + timedelta(minutes=11), timedelta(minutes=15))
    with pytest.raises(StaleRateError):
        require_fresh(r, NOW + timedelta(hours=1))
    assert rates.rate(Coin.USDC).usd_per_coin == Decimal("0.999")
    assert rates.rate(Coin.USDT).usd_per_coin == 1
    with pytest.raises(RateUnavailable):
        rates.rate(Coin.XMR)
    with pytest.raises(TypeError):
        Rate(Coin.BTC, 30000.5, "x", NOW)
    with pytest.raises(ValueError):
        Rate(Coin.BTC, Decimal(1), "x", datetime(2026, 1, 1))  # naive time


def test_future_dated_rate_is_stale():
    assert is_stale(Rate(Coin.BTC, Decimal(1), "x", NOW + timedelta(hours=1)), NOW)


# -- gap limit -----------------------------------------------------------------------------
def test_gap_warning():
    assert not gap_warning(None, None)
    assert not gap_warning(None, 18)           # 19 unused issued
    assert gap_warning(None, 19)               # 20 unused: a restoring wallet stops here
    assert not gap_warning(10, 29)
    assert gap_warning(10, 30)
    assert gap_warning(0, 5, limit=5)


# -- registry ------------------------------------------------------------------------------
def test_registry_offers_only_configured_coins():
    assert build_adapters({}) == {}
    cfg = {"BTC_XPUB": ZPUB, "ETH_XPUB": ETH_XPUB, "USDC_CONTRACT": "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48",
           "SOL_MERCHANT_ADDRESS": "11111111111111111111111111111112", "BTC_CONFIRMATIONS": "3"}
    derive_only = build_adapters(cfg)
    assert set(derive_only) == {Coin.BTC, Coin.ETH, Coin.USDC, Coin.SOL}
    assert derive_only[Coin.BTC].required_confirmations == 3
    assert derive_only[Coin.BTC].address_for_index(0) == BIP84_VECTORS[0]
    assert build_adapters(cfg, require_backend=True) == {}  # no node URLs: nothing to watch with
    full = build_adapters({**cfg, "BTC_RPC_URL": "http://u:p@127.0.0.1:1/", "ETH_RPC_URL": "http://127.0.0.1:1",
                           "ETH_CHAIN_ID": "11155111", "MONERO_WALLET_RPC_URL": "http://127.0.0.1:1",
                           "SOL_RPC_URL": "http://127.0.0.1:1"}, require_backend=True)
    assert set(full) == {Coin.BTC, Coin.ETH, Coin.USDC, Coin.XMR, Coin.SOL}
    assert full[Coin.ETH].chain_id == 11155111  # built without any network access


# -- the walker against an in-memory chain (no node) ---------------------------------------
class FakeCore:
    """getblockcount / getblockhash / getblock 2 / getrawmempool / getmempoolentry / gettxout
    over an in-memory chain."""

    def __init__(self):
        self.chain: list[dict] = []
        self.mempool: dict[str, dict] = {}
        self.spent: set[tuple[str, int]] = set()
        self.add_block([])

    def add_block(self, txs, tag=""):
        h = len(self.chain)
        bhash = f"{h:04d}{tag}".ljust(64, "0")
        prev = self.chain[-1]["hash"] if self.chain else None
        self.chain.append({"hash": bhash, "height": h, "previousblockhash": prev, "tx": txs,
                           "time": 1_700_000_000 + 600 * h})
        return bhash

    def call(self, method, *params):
        if method == "getblockcount":
            return len(self.chain) - 1
        if method == "getblockhash":
            return self.chain[params[0]]["hash"]
        if method == "getblock":
            return next(b for b in self.chain if b["hash"] == params[0])
        if method == "getrawmempool":
            return list(self.mempool)
        if method == "getrawtransaction":
            return self.mempool[params[0]]
        if method == "getmempoolentry":
            return {"time": 1_699_999_999}
        if method == "gettxout":
            return None if (params[0], params[1]) in self.spent else {"value": Decimal(1)}
        raise AssertionError(method)


def tx(txid, *outs, old_style=False):
    vout = []
    for n, (addr, value) in enumerate(outs):
        spk = {"addresses": [addr]} if old_style else {"address": addr}
        vout.append({"n": n, "value": Decimal(value), "scriptPubKey": spk})
    return {"txid": txid, "vout": vout, "vin": [{"txid": f"funding-{txid}", "vout": 0}]}


def test_walker_confirmations_reorg_and_old_style_addresses():
    core = FakeCore()
    a = UtxoAdapter(Coin.BTC, ZPUB, rpc=core, required_confirmations=2)
    w1, w2 = a.address_for_index(0), a.address_for_index(1)
    cursor = {"height": 0}
    core.mempool["t0"] = tx("t0", ("other", "1"), (w1, "0.5"))
    r = a.scan({w1, w2}, cursor)
    assert [(p.key, p.amount, p.confirmations) for p in r.payments] == [(("t0", 1), 50_000_000, 0)]
    del core.mempool["t0"]
    core.add_block([tx("t0", ("other", "1"), (w1, "0.5")), tx("t1", (w2, "0.00000001"), old_style=True)])
    r = a.scan({w1, w2}, json.loads(json.dumps(r.cursor)))
    assert sorted((p.key, p.amount, p.confirmations) for p in r.payments) == [
        (("t0", 1), 50_000_000, 1), (("t1", 0), 1, 1)]
    # reorg: block 1 replaced by a block without t1
    core.chain.pop()
    core.add_block([tx("t0", ("other", "1"), (w1, "0.5"))], tag="b")
    core.add_block([])
    r = a.scan({w1, w2}, r.cursor)
    assert r.reorged == [("t1", 0)]
    assert [(p.key, p.confirmations, p.block_hash[:5]) for p in r.payments] == [(("t0", 1), 2, "0001b")]
    r = a.scan({w1, w2}, r.cursor)
    assert r.payments == [] and r.reorged == []


def test_mempool_payments_dated_by_the_node_and_judged_when_they_leave_unmined():
    core = FakeCore()
    a = UtxoAdapter(Coin.BTC, ZPUB, rpc=core)
    w = a.address_for_index(0)
    core.mempool.update({"kept": tx("kept", (w, "1")), "conflicted": tx("conflicted", (w, "2")),
                         "evicted": tx("evicted", (w, "3"))})
    r = a.scan({w}, {"height": 0})
    assert {p.txid: p.chain_time for p in r.payments} == dict.fromkeys(("kept", "conflicted", "evicted"), 1_699_999_999)
    del core.mempool["conflicted"], core.mempool["evicted"]
    core.spent.add(("funding-conflicted", 0))  # its input is spent by another transaction
    r = a.scan({w}, json.loads(json.dumps(r.cursor)))
    assert sorted(r.dropped) == [("conflicted", 0, "double_spent"), ("evicted", 0, "evicted")]
    assert [p.txid for p in r.payments] == ["kept"] and list(r.cursor["pool"]) == ["kept"]
    # mined instead: found in the block with the block's time, never judged dropped
    del core.mempool["kept"]
    core.add_block([tx("kept", (w, "1"))])
    r = a.scan({w}, r.cursor)
    assert r.dropped == [] and [(p.txid, p.confirmations, p.chain_time) for p in r.payments] == [
        ("kept", 1, 1_700_000_600)]


def test_match_outputs_is_set_lookup_and_ignores_multisig_lists():
    txs = [tx("a", ("x", "1")), {"txid": "b", "vout": [{"n": 0, "value": Decimal(1),
                                                         "scriptPubKey": {"addresses": ["x", "y"]}}]}]
    assert [(f.txid, f.amount) for f in match_outputs(txs, {"x": 1})] == [("a", 100_000_000)]
