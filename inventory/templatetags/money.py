"""The `money` template library ({% load money %}): the text of integer USD cents, made by
core.money (the only place money turns into text)."""
from django import template

from core.money import format_usd

register = template.Library()


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
