"""Shared by the payment tests: watch-only adapters from the BIP84/BIP44 test mnemonic
(derivation only, no node), operator rates, and DetectedPayment shorthands."""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal

from bip_utils import (
    Base58Decoder,
    Base58Encoder,
    Bip39SeedGenerator,
    Bip44,
    Bip44Coins,
    Bip84,
    Bip84Coins,
)

from billing.models import CoinRate, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, DetectedPayment, ScanResult
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.utxo import UtxoAdapter
from billing.payments.services import payments_apply_scan

MNEMONIC = "abandon " * 11 + "about"
USDT_CONTRACT = "0xdAC17F958D2ee523a2206206994597C13D831ec7"
_txids = itertools.count(1)


def ltc_account_key() -> str:
    """The BIP84 account key as a vpub (SLIP-132: native SegWit on a test network)."""
    seed = Bip39SeedGenerator(MNEMONIC).Generate()
    ttub = Bip84.FromSeed(seed, Bip84Coins.LITECOIN_TESTNET).Purpose().Coin().Account(0).PublicKey().ToExtended()
    return Base58Encoder.CheckEncode(bytes.fromhex("045f1cf6") + Base58Decoder.CheckDecode(ttub)[4:])


def eth_account_key() -> str:
    seed = Bip39SeedGenerator(MNEMONIC).Generate()
    return Bip44.FromSeed(seed, Bip44Coins.ETHEREUM).Purpose().Coin().Account(0).PublicKey().ToExtended()


def offline_adapters() -> dict:
    """LTC (regtest, 6 confirmations) and USDT (12) that derive addresses but never scan."""
    return {Coin.LTC: UtxoAdapter(Coin.LTC, ltc_account_key(), network="regtest"),
            Coin.USDT: EvmAdapter(Coin.USDT, eth_account_key(), token=USDT_CONTRACT, chain_id=31337)}


@contextmanager
def offline_coins():
    with coins_config.use_adapters(offline_adapters()):
        yield


def set_rate(coin: str, usd: str, at: datetime) -> CoinRate:
    return CoinRate.objects.update_or_create(coin=coin, defaults={"usd_per_coin": Decimal(usd), "set_at": at})[0]


def txid() -> str:
    return f"{next(_txids):064x}"


def paid(quote: Quote, amount: int, confirmations: int, tx: str | None = None, n: int = 0) -> DetectedPayment:
    return DetectedPayment(Coin(quote.coin), tx or txid(), n, quote.reference or quote.address, int(amount),
                           confirmations, "b" * 64 if confirmations else None, 100 if confirmations else None)


def apply(quote_or_coin, payments, now, reorged=()):
    coin = quote_or_coin.coin if isinstance(quote_or_coin, Quote) else quote_or_coin
    return payments_apply_scan(coin=coin, scan=ScanResult(list(payments), {}, list(reorged)), now=now)


def fresh(obj):
    obj.refresh_from_db()
    return obj
