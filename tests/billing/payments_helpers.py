"""Shared by the payment tests: watch-only adapters from the BIP84/BIP44 test mnemonic
(derivation only, no node), operator rates, DetectedPayment shorthands, a scripted adapter
that replays scans, and the amounts of a $65 order in litoshi."""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from datetime import datetime, timedelta
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

from billing.models import CoinRate, Invoice, LedgerEntry, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, DetectedPayment, ScanResult
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.utxo import UtxoAdapter
from billing.payments.quotes import quote_create
from billing.payments.services import payments_apply_scan
from billing.services import account_for
from rental.agent import Instance
from rental.models import LeaseState
from rental.services import lease_provisioned
from tests.factories import order

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


USD = 1_000_000  # litoshi per dollar at $100/LTC
DUE = 65 * USD   # $65.00


def balance(customer):
    return account_for(customer).balance_cents


def credits(kind=None):
    qs = LedgerEntry.objects.exclude(kind__in=[LedgerEntry.Kind.ORDER, LedgerEntry.Kind.TOPUP])
    return list((qs.filter(kind=kind) if kind else qs).values_list("amount_cents", flat=True))


class ScriptedAdapter:
    """Replays results: scan() reports every payment found since ``cursor["pos"]``."""

    coin = Coin.LTC
    required_confirmations = 6

    def __init__(self, payments):
        self.payments, self.seen_cursors = payments, []

    def scan(self, watch, cursor):
        self.seen_cursors.append(dict(cursor))
        found = [p for p in self.payments[cursor.get("pos", 0):] if p.address in watch]
        return ScanResult(found, {"pos": len(self.payments)}, [])


def place(customer, at, coin="LTC"):
    """An unpaid order (rtx-3090, one week: $65) and its quote, LTC at $100/LTC."""
    set_rate("LTC", "100", at)
    lease, invoice = order(customer, at, pay=False)
    return lease, invoice, quote_create(invoice=invoice, coin=coin, now=at)


def running(customer, at):
    """An order paid with one confirmed LTC payment, its lease active a few minutes later."""
    lease, invoice, quote = place(customer, at)
    p = paid(quote, DUE, 6)
    apply(quote, [p], at + timedelta(minutes=1))
    assert lease_provisioned(lease_id=lease.pk, instance=Instance("10.0.0.9", 2209), now=at + timedelta(minutes=2))
    assert fresh(invoice).state == Invoice.State.PAID and fresh(lease).state == LeaseState.ACTIVE
    return lease, invoice, quote, p


def reverse(quote, p, at):
    apply(quote, [], at, reorged=[(p.txid, 0)])
