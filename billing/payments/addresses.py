"""Receive addresses and the wallet gap limit (one person cannot close a coin for
everybody).

Wallets that restore from the xpub scan only ``ADDRESS_GAP_LIMIT`` (20) addresses past the
last one that received funds (``coins.utxo.gap_warning``). Our watchers see every address we
issued whatever the gap, so a long gap only hides payments in the operator's *wallet* (the
funds are safe; a larger gap limit shows them): it is an operator warning, never a reason to
refuse every customer a coin. What bounds the gap is per customer: one customer holds at
most ``ADDRESSES_UNPAID_PER_CUSTOMER`` never-paid addresses past the wallet's last paid one
(ETH, USDT and USDC share one wallet, so one count); then that customer is refused new
addresses of the wallet — and the coin is not offered to them (``coins_offered``).
"""
from __future__ import annotations

import logging

from django.db.models import F, Max
from django.utils.translation import gettext

from ..models import CoinWallet, Quote
from . import config as coins_config
from .coins.base import Coin
from .coins.utxo import gap_warning
from .pricing import PaymentError

log = logging.getLogger("billing.payments")


def unpaid_addresses(coin: Coin, customer_id: int) -> int:
    """The customer's never-paid addresses past the wallet's last paid index."""
    if coin in (Coin.XMR, Coin.SOL):
        return 0
    wallet = CoinWallet.objects.filter(coin=coins_config.wallet_coin(coin)).values_list(
        "highest_paid_index", flat=True).first()
    return (Quote.objects.filter(coin__in=coins_config.wallet_coins(coin), invoice__customer_id=customer_id,
                                 derivation_index__gt=-1 if wallet is None else wallet, payments__isnull=True)
            .values("derivation_index").distinct().count())


def unpaid_addresses_full(coin: Coin, customer_id: int) -> bool:
    return unpaid_addresses(coin, customer_id) >= coins_config.unpaid_addresses_per_customer()


def receive_address(adapter, coin: Coin, *, customer_id: int) -> tuple[str, int | None, str]:
    """(address, derivation index, Solana Pay reference)."""
    if coin is Coin.XMR:
        try:
            address, index = adapter.create_address()
            used = Quote.objects.filter(coin=Coin.XMR).aggregate(m=Max("derivation_index"))["m"]
            if used is not None and index <= used:  # the wallet was restored from its keys: it counts from 1 again
                log.warning("XMR: the wallet gave subaddress %d, a quote already has up to %d; skipping past it",
                            index, used)
                address, index = adapter.create_address_after(used)
        except (OSError, RuntimeError, ValueError) as exc:  # wallet-rpc down, refusing, or answering nonsense
            log.error("XMR: monero-wallet-rpc could not create a subaddress: %s", exc)
            raise PaymentError(gettext("We cannot create a Monero address right now; please pay with another coin "
                                       "or try again in a few minutes.")) from None
        return address, index, ""
    if coin is Coin.SOL:
        return adapter.merchant, None, adapter.address_for_index(0)
    wallet = CoinWallet.objects.get_or_create(coin=coins_config.wallet_coin(coin))[0]
    wallet = CoinWallet.objects.select_for_update().get(pk=wallet.pk)  # one customer's quotes count in turn
    if unpaid_addresses_full(coin, customer_id):
        raise PaymentError(gettext("You have %(n)s unpaid %(coin)s payment addresses; please pay one of your open "
                                   "quotes, or pay with another coin.")
                           % {"n": coins_config.unpaid_addresses_per_customer(), "coin": coin})
    CoinWallet.objects.filter(pk=wallet.pk).update(next_index=F("next_index") + 1)
    wallet.next_index += 1
    if wallet_gap_exceeded(wallet):
        log.warning("%s: %d addresses issued past the last paid one (index %d): raise the wallet's gap limit "
                    "to see payments to them", wallet.coin, wallet.next_index - 1 - wallet.highest_paid_index,
                    wallet.highest_paid_index)
    return adapter.address_for_index(wallet.next_index - 1), wallet.next_index - 1, ""


def wallet_gap_exceeded(wallet: CoinWallet) -> bool:
    """Unpaid addresses run ``ADDRESS_GAP_LIMIT`` (20) or more past the last paid one: a
    wallet restored from the xpub with the default gap limit would not see the next payment."""
    issued = wallet.next_index - 1 if wallet.next_index else None
    return gap_warning(wallet.highest_paid_index, issued, coins_config.gap_limit())


def wallets_past_gap() -> list[str]:
    """For the operators' dashboard: the wallets to restore with a larger gap limit."""
    return [w.coin for w in CoinWallet.objects.order_by("coin") if wallet_gap_exceeded(w)]
