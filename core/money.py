"""Money is integer USD cents everywhere; these functions are the only place it turns into
text: the ledger's and the services' messages call them, and the `money` template library
(inventory/templatetags/money.py: `usd`, `usd_cents`) wraps them for the templates."""
from collections.abc import Callable

from django.utils.formats import get_format, number_format


def format_usd(cents: int | None, *, always_cents: bool = False) -> str:
    if cents is None:
        return "—"
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(int(cents)), 100)
    whole = number_format(dollars, force_grouping=True)
    if rest or always_cents:
        return f"{sign}${whole}.{rest:02d}"
    return f"{sign}${whole}"


def usd_formatter(*, always_cents: bool = False) -> Callable[[int | None], str]:
    """``format_usd`` for the active language with its separators looked up once: for the
    Python-built sizing tables, whose rows would otherwise ask for the locale's formats
    three times per price. Same text as ``format_usd``."""
    sep, grouping = get_format("THOUSAND_SEPARATOR"), get_format("NUMBER_GROUPING")
    if grouping != 3 or not isinstance(sep, str):
        return lambda cents: format_usd(cents, always_cents=always_cents)

    def fmt(cents: int | None) -> str:
        if cents is None:
            return "—"
        sign = "-" if cents < 0 else ""
        dollars, rest = divmod(abs(int(cents)), 100)
        whole = f"{dollars:,}".replace(",", sep) if sep != "," else f"{dollars:,}"
        if rest or always_cents:
            return f"{sign}${whole}.{rest:02d}"
        return f"{sign}${whole}"

    return fmt
