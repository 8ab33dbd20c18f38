"""The calculator's fixed texts in the active language, each looked up once per process
and language.

A cold calculator fragment shows ~80 fixed texts (column heads, labels, units); Django's
``gettext`` finds the active translation through a context-local on every call (~3–6 µs
here), so looking them all up again was a fifth of a cold render. ``texts()`` reads the
active language once and gives a table of msgid → translation that fills itself on first
use; the translation is ``gettext``'s own, so nothing a reader sees changes.

The table holds what the message catalogues hold, not anything about an input, so it is
as valid for the next input as for this one. It is dropped when the catalogues can change
under a running process: a setting changes (tests: LANGUAGES, LOCALE_PATHS, formats —
Django then reloads its own translations) or the autoreloader sees a ``.mo`` file change
(runserver reloads translations without restarting).
"""

from __future__ import annotations

import threading

from django.core.signals import setting_changed
from django.utils.autoreload import file_changed
from django.utils.translation import get_language, gettext, ngettext, pgettext


class Texts(dict):
    """msgid → translation in one language; ``pgettext``/``ngettext`` lookups beside it."""

    def __init__(self, language: str | None):
        super().__init__()
        self.language = language
        self.extra: dict = {}  # per-language values that are not msgids (formats, formatters)
        #: a plural translation → the English form (what ``{% blocktranslate %}`` falls back
        #: to when a translation does not format)
        self.english: dict[str, str] = {}

    def __missing__(self, msgid: str) -> str:
        value = self[msgid] = gettext(msgid)
        return value

    def pgettext(self, context: str, msgid: str) -> str:
        key = ("p", context, msgid)
        try:
            return self.extra[key]
        except KeyError:
            value = self.extra[key] = pgettext(context, msgid)
            return value

    def ngettext(self, singular: str, plural: str, n: int) -> str:
        key = ("n", singular, plural, n)
        try:
            return self.extra[key]
        except KeyError:
            value = self.extra[key] = ngettext(singular, plural, n)
            self.english[value] = singular if n == 1 else plural
            return value


_tables: dict[str | None, Texts] = {}
_lock = threading.Lock()


def texts() -> Texts:
    """The table of the active language (``translation.override`` and the locale
    middleware's activation included)."""
    language = get_language()
    table = _tables.get(language)
    if table is None:
        with _lock:
            table = _tables.setdefault(language, Texts(language))
    return table


def clear(**kwargs) -> None:
    with _lock:
        _tables.clear()


def _mo_changed(sender, file_path, **kwargs) -> None:
    if file_path.suffix == ".mo":
        clear()


setting_changed.connect(clear, dispatch_uid="sizing.texts.clear")
file_changed.connect(_mo_changed, dispatch_uid="sizing.texts.mo_changed")
