"""Money is integer USD cents everywhere; these filters are the only place it turns into text."""
from django import template
from django.utils.formats import number_format

register = template.Library()


def format_usd(cents: int | None, *, always_cents: bool = False) -> str:
    if cents is None:
        return "—"
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(int(cents)), 100)
    whole = number_format(dollars, force_grouping=True)
    if rest or always_cents:
        return f"{sign}${whole}.{rest:02d}"
    return f"{sign}${whole}"


@register.filter
def usd(cents):
    """12345 -> $123.45; 169000 -> $1,690."""
    return format_usd(cents)


@register.filter
def usd_cents(cents):
    """Always two decimals: 235 -> $2.35, 200 -> $2.00."""
    return format_usd(cents, always_cents=True)


@register.filter
def get_item(mapping, key):
    return mapping.get(key, 0) if mapping else 0
