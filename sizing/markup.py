"""Markup written in Python as the sizing templates rendered it: ``{{ value }}``'s escaping
and localisation, ``{% translate %}`` (``_t``) and ``{% blocktranslate %}`` (``_bt``,
``_nbt``) through the language's texts table (``sizing.texts``), the ``gb`` filter and the
shop's price text. Used by the calculator's builders (``sizing.fragment`` and the
template library ``sizing_tags``)."""

import functools
import html

from django.utils.formats import get_format, localize
from django.utils.safestring import SafeData

from core.money import usd_formatter as money_formatter

from .texts import Texts

#: html.escape, remembered for the texts a page repeats: the fixed labels and the catalog's
#: offer, card and site names come back on every answer, whatever its input (a cold
#: fragment escaped ~130 strings); bounded, so free-form texts cannot grow it.
_escape = functools.lru_cache(maxsize=4096)(html.escape)


def _escaped(text: str) -> str:
    """``html.escape(text)`` of an exact str: most of an answer's texts are figures ("1,234.5",
    "$1,881") with nothing to escape, which five ``in`` tests tell more cheaply than the
    remembered escape's hashing (a new string every time) and, on a miss, ``html.escape``'s
    five replaces."""
    if "&" in text or "<" in text or ">" in text or '"' in text or "'" in text:
        return _escape(text)
    return text


def _esc(value, dot: bool | None = None) -> str:
    """``{{ value }}`` in an autoescaping template: localized, then escaped unless safe.
    ``dot``: whether the language's decimal separator is "." (looked up when not given)."""
    if type(value) is str:
        return _escaped(value)
    if isinstance(value, str):
        return value if isinstance(value, SafeData) else html.escape(value)
    if type(value) is int:
        return str(value)
    if type(value) is float:
        text = str(value)
        # Django writes a float with the language's decimal separator (en and zh_Hans: "."),
        # and one whose repr has an exponent (or inf, nan) through Decimal
        if "e" not in text and "n" not in text and (_dot_decimals() if dot is None else dot):
            return text
    return html.escape(str(localize(value)))


def _dot_decimals(tr: Texts | None = None) -> bool:
    """Whether the language writes decimals with "." (kept in the language's texts table)."""
    if tr is None:
        return get_format("DECIMAL_SEPARATOR") == "."
    try:
        return tr.extra["dot"]
    except KeyError:
        value = tr.extra["dot"] = get_format("DECIMAL_SEPARATOR") == "."
        return value


def _t(translated: str) -> str:
    """``{% translate msgid %}`` is ``_t(tr[gettext_noop(msgid)])``: the translation,
    escaped (the literal gettext_noop call is what makemessages finds)."""
    return _escape(translated) if type(translated) is str else html.escape(translated)


def _bt(tr: Texts, msgid: str, **values) -> str:
    """``{% blocktranslate with name=value %}``: the translation (not escaped) with its
    values (escaped); one that does not format falls back to the English, as the tag does.
    Call it with ``gettext_noop("…")`` so makemessages finds the msgid."""
    return _formatted(tr[msgid], msgid, values, tr)


def _formatted(translated: str, english: str, values: dict, tr: Texts) -> str:
    """``values`` is the caller's own keyword dict, escaped in place (no second dict: a
    cold fragment formats ~20 texts)."""
    extra = tr.extra
    dot = extra["dot"] if "dot" in extra else _dot_decimals(tr)
    for k, v in values.items():
        if type(v) is not str:
            values[k] = _esc(v, dot)
        elif "&" in v or "<" in v or ">" in v or '"' in v or "'" in v:  # _escaped, inlined
            values[k] = _escape(v)
    try:
        return translated % values
    except (KeyError, ValueError):
        return english % values


def _nbt(tr: Texts, translated: str, n: int, **values) -> str:
    """``{% blocktranslate count n=… %}…{% plural %}…``: ``translated`` is
    ``tr.ngettext(singular, plural, n)`` (literal msgids, so makemessages finds them), and
    ``n`` is among the values."""
    return _formatted(translated, tr.english.get(translated, translated), {"n": n, **values}, tr)


def usd_formatter(*, always_cents: bool = False, tr: Texts | None = None):
    """The shop's price text (``usd`` / ``usd_cents``, core.money: the text the ``money``
    template library gives), kept in the language's texts table when given (the formatter
    depends on the language's formats)."""
    key = ("usd", always_cents)
    if tr is not None and key in tr.extra:
        return tr.extra[key]
    fmt = money_formatter(always_cents=always_cents)
    if tr is not None:
        tr.extra[key] = fmt
    return fmt


def _gb(value, digits: int = 1) -> str:
    """The ``gb`` filter."""
    return "—" if value is None else f"{value:,.{digits}f}"
