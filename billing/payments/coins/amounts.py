"""USD cents -> coin base units, and exact decimal formatting. Decimal only, never floats."""

from __future__ import annotations

from decimal import ROUND_UP, Decimal, localcontext

from .base import COIN_SPECS, Coin

#: Exchange rates are "USD per whole coin"; ints, Decimals or decimal strings are accepted.
RateLike = Decimal | int | str


def _to_decimal(value: RateLike, what: str) -> Decimal:
    if isinstance(value, float) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, Decimal or decimal string, not {type(value).__name__}")
    d = Decimal(value)
    if not d.is_finite():
        raise ValueError(f"{what} must be finite")
    return d


def usd_cents_to_base_units(
    usd_cents: int,
    usd_per_coin: RateLike | None = None,
    *,
    decimals: int | None = None,
    coin: Coin | str | None = None,
    peg: RateLike = 1,
) -> int:
    """Amount to ask for, in base units, for ``usd_cents`` at ``usd_per_coin``, rounded UP.

    Rounding up means the merchant never receives less than the USD price. For stablecoins
    (USDT, USDC) ``usd_per_coin`` may be omitted: the ``peg`` (USD per token, default 1) is
    used. Give either ``coin`` or ``decimals``.
    """
    if isinstance(usd_cents, bool) or not isinstance(usd_cents, int):
        raise TypeError("usd_cents must be an int")
    if usd_cents < 0:
        raise ValueError("usd_cents must be >= 0")
    spec = COIN_SPECS[Coin(coin)] if coin is not None else None
    if decimals is None:
        if spec is None:
            raise ValueError("give coin or decimals")
        decimals = spec.decimals
    if usd_per_coin is None:
        if spec is None or not spec.stablecoin:
            raise ValueError("a rate is required for non-stablecoins")
        usd_per_coin = peg
    rate = _to_decimal(usd_per_coin, "usd_per_coin")
    if rate <= 0:
        raise ValueError("usd_per_coin must be > 0")
    with localcontext() as ctx:
        ctx.prec = 80
        units = Decimal(usd_cents) * (Decimal(10) ** decimals) / (rate * 100)
        return int(units.to_integral_value(rounding=ROUND_UP))


def format_amount(base_units: int, decimals: int) -> str:
    """Exact decimal string of a base-unit amount: ``format_amount(1500, 8) == "0.000015"``.

    Trailing zeros are dropped (``"1"``, not ``"1.00000000"``), as BIP21 / EIP-681 / Solana
    Pay URIs expect; no exponent notation.
    """
    if isinstance(base_units, bool) or not isinstance(base_units, int):
        raise TypeError("base_units must be an int")
    sign = "-" if base_units < 0 else ""
    whole, frac = divmod(abs(base_units), 10**decimals)
    if decimals == 0 or frac == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{str(frac).rjust(decimals, '0').rstrip('0')}"


def parse_amount(text: str | Decimal, decimals: int) -> int:
    """Exact inverse of ``format_amount`` (raises if ``text`` has more than ``decimals`` places)."""
    d = _to_decimal(text, "amount")
    with localcontext() as ctx:
        ctx.prec = 100
        units = d.scaleb(decimals)
        if units != units.to_integral_value():
            raise ValueError(f"{text} has more than {decimals} decimal places")
        return int(units)
