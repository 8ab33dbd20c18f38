"""Crypto payment settings: the adapter config from the environment (or Django settings of
the same name), and the payment rules (confirmations, tolerance, rate age, windows).

Every key of ``billing.payments.coins.registry`` is read from ``settings.<KEY>`` first, then
``os.environ[<KEY>]``; a coin is offered only when it can be watched
(``require_backend=True``). Tests swap the adapters with ``use_adapters({...})``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings

from .coins.base import Coin, CoinAdapter
from .coins.registry import build_adapters

ADAPTER_KEYS = (
    "BTC_XPUB", "BTC_RPC_URL", "BTC_RPC_COOKIE", "BTC_NETWORK", "BTC_START_HEIGHT",
    "LTC_XPUB", "LTC_RPC_URL", "LTC_RPC_COOKIE", "LTC_NETWORK", "LTC_START_HEIGHT",
    "ETH_XPUB", "ETH_RPC_URL", "ETH_CHAIN_ID", "ETH_START_HEIGHT", "USDT_CONTRACT", "USDC_CONTRACT",
    "MONERO_WALLET_RPC_URL", "XMR_SETTLED_WATCH_BLOCKS", "SOL_MERCHANT_ADDRESS", "SOL_RPC_URL",
    *(f"{c}_CONFIRMATIONS" for c in Coin),
)

#: ERC-20s share the ETH account key, so they share its address counter (one address, one quote).
WALLET_OF = {Coin.USDT: Coin.ETH, Coin.USDC: Coin.ETH}

_override: dict[Coin, CoinAdapter] | None = None
_cache: dict[tuple, dict[Coin, CoinAdapter]] = {}


def setting(key: str, default: Any = None) -> Any:
    value = getattr(settings, key, None)
    if value in (None, ""):
        value = os.environ.get(key)
    return default if value in (None, "") else value


def adapter_config() -> dict[str, Any]:
    return {key: setting(key) for key in ADAPTER_KEYS if setting(key) is not None}


def adapters(*, require_backend: bool = True) -> dict[Coin, CoinAdapter]:
    """The configured coins' adapters (cached per config: the UTXO mempool cache and the
    Monero subaddress cache survive between watcher passes)."""
    if _override is not None:
        return dict(_override)
    config = adapter_config()
    key = (require_backend, tuple(sorted(config.items())))
    if key not in _cache:
        _cache[key] = build_adapters(config, require_backend=require_backend)
    found = dict(_cache[key])
    if getattr(settings, "DEMO_PAYMENTS", False):  # the demo store's coin (coins/demo.py); never in production
        from .coins.demo import DemoAdapter

        found[Coin.DEMO] = DemoAdapter()
    return found


def adapter(coin: str) -> CoinAdapter | None:
    return adapters().get(Coin(coin))


@contextmanager
def use_adapters(mapping: Mapping[Coin | str, CoinAdapter]):
    """Tests: offer exactly these adapters."""
    global _override
    saved, _override = _override, {Coin(c): a for c, a in mapping.items()}
    try:
        yield
    finally:
        _override = saved


def wallet_coin(coin: str) -> str:
    return str(WALLET_OF.get(Coin(coin), Coin(coin)))


def wallet_coins(coin: str) -> list[str]:
    """The coins whose quotes share ``coin``'s receive addresses and counter (ETH, USDT, USDC)."""
    return [str(c) for c in Coin if wallet_coin(c) == wallet_coin(coin)]


def rule(key: str):
    """A payment rule: its one definition is the named setting in storefront/settings/payments.py
    (its blocks there: environment value or default); read at call time."""
    return getattr(settings, key)


def _minutes(key: str) -> timedelta:
    return timedelta(minutes=int(rule(key)))


def tolerance_bps() -> int:
    return int(rule("UNDERPAYMENT_TOLERANCE_BPS"))


def quote_window() -> timedelta:
    """The standard payment window: of an order (``billing.services.order_payment_window``
    shortens it for new accounts), a top-up, and a quote (one definition:
    ``billing.ledger.payment_window``, below every money domain)."""
    from ..ledger import payment_window

    return payment_window()


def quote_min_window() -> timedelta:
    """The least time a customer gets to pay a quote, even at the end of an order's window."""
    return _minutes("PAYMENT_QUOTE_MIN_MINUTES")


def quotes_per_hour() -> int:
    """New quotes (fresh addresses) one customer may ask for per hour."""
    return int(rule("QUOTES_PER_CUSTOMER_PER_HOUR"))


def unpaid_addresses_per_customer() -> int:
    """Never-paid receive addresses one customer may hold in a wallet's gap at once."""
    return int(rule("ADDRESSES_UNPAID_PER_CUSTOMER"))


def rate_max_age() -> timedelta:
    return _minutes("RATE_MAX_AGE_MINUTES")


def partial_max_extension() -> timedelta:
    """How far past its first window a partly paid quote may be extended (once)."""
    return _minutes("PARTIAL_PAYMENT_MAX_EXTENSION_MINUTES")


def monitoring_window() -> timedelta:
    """How long an unconfirmed payment is watched from its first sighting (chain time):
    an order's slots stay held that long while its confirmations arrive; past it, the
    payment is invalid and the hold released."""
    return _minutes("PAYMENT_MONITORING_MINUTES")


def reversal_grace() -> timedelta:
    """How long a lease keeps running after the payment that paid it was reversed on its
    chain, while the customer's balance is negative; then it is suspended."""
    return _minutes("PAYMENT_REVERSAL_GRACE_MINUTES")


def watcher_lag_max() -> timedelta:
    """How long the expiry sweeps wait for a coin's watcher that has not scanned past an
    order's deadline (node or watcher down), so a payment dated on time by the chain still
    wins; past it the order expires anyway."""
    return _minutes("PAYMENT_WATCHER_LAG_MAX_MINUTES")


def auto_credit_max_percent() -> int:
    """What one quote may credit to the balance automatically, in % of its USD value."""
    return int(rule("PAYMENT_AUTO_CREDIT_MAX_PERCENT"))


def dust_bps() -> int:
    """Payments below this share of the quote (basis points) never extend a hold."""
    return int(rule("PAYMENT_DUST_BPS"))


def node_max_tip_age() -> timedelta:
    return _minutes("PAYMENT_NODE_MAX_TIP_AGE_MINUTES")


def speed_policy() -> list[tuple[int, int]]:
    """[(usd cents, confirmations)] ascending: a quote worth less than the cents needs that
    many confirmations (BTCPay's speed policy, by amount)."""
    raw = str(rule("PAYMENT_SPEED_POLICY"))
    pairs = (item.split(":") for item in raw.split(",") if item.strip())
    return sorted((int(cents), int(confs)) for cents, confs in pairs)


def late_watch() -> timedelta:
    """How long expired quotes stay watched, so late payments are still credited."""
    return timedelta(days=int(rule("LATE_PAYMENT_WATCH_DAYS")))


def gap_limit() -> int:
    return int(rule("ADDRESS_GAP_LIMIT"))


def stable_peg(coin: str):
    from decimal import Decimal

    return Decimal(str(setting(f"{coin}_PEG_USD", "1")))


def price_sources() -> list[dict]:
    """``PRICE_SOURCES``: a JSON list of {"name", "url", "path"[, "time_path"]} (``{coin}``
    and ``{coin_lower}`` are filled in); empty: rates are set by hand only."""
    import json

    raw = rule("PRICE_SOURCES")
    if isinstance(raw, (list, tuple)):
        return list(raw)
    return json.loads(raw) if str(raw).strip() else []


def price_sources_min() -> int:
    """How many agreeing sources make a rate on their own (the quorum, see ``rates.judge``)."""
    return int(rule("PRICE_SOURCES_MIN"))


def price_tolerance_bps() -> int:
    """How far (basis points) an answer may be from the answers' median and still agree."""
    return int(rule("PRICE_SOURCES_TOLERANCE_BPS"))


def price_max_move_bps() -> int:
    """How far (basis points) a new rate may be from the last accepted one (and, from fewer
    sources than the quorum, from the last rate a quorum or an operator set)."""
    return int(rule("PRICE_MAX_MOVE_BPS"))
