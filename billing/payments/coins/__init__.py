"""Chain side of crypto payments: one watch-only adapter per chain behind one interface.

No Django models here: the billing services persist quotes, payments and each adapter's
scan cursor, and call these adapters. See ``base.py`` for the interface.
"""

from .amounts import format_amount, usd_cents_to_base_units
from .base import (
    COIN_SPECS,
    Coin,
    CoinAdapter,
    CoinSpec,
    DetectedPayment,
    ScanResult,
)
from .rates import PegRates, Rate, RateProvider, StaleRateError, StaticRates, is_stale

__all__ = [
    "COIN_SPECS",
    "Coin",
    "CoinAdapter",
    "CoinSpec",
    "DetectedPayment",
    "PegRates",
    "Rate",
    "RateProvider",
    "ScanResult",
    "StaleRateError",
    "StaticRates",
    "format_amount",
    "is_stale",
    "usd_cents_to_base_units",
]
