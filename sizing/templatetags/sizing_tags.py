"""Template helpers for the sizing pages: the server-rendered SVG memory bar (``sizing.membar``)
and the calculator's per-row tables (recommendations, one-change plans, the breakdown).

The bar and the rows are built here in Python rather than in templates: a cold
calculator fragment spent most of its time in the template engine resolving the same
variables, filters and {% translate %} tags once per segment and row. The builders write
exactly the markup the templates wrote (tests/sizing/test_golden.py compares byte for
byte) with the templates' escaping rules — ``{{ value }}`` and ``{% translate %}`` are
escaped, a ``{% blocktranslate %}``'s text is not but its variables are — and the same
msgids, so the zh_Hans catalogue still applies. Each text is translated once per call.
"""

from django import template
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_noop, pgettext_lazy

from ..markup import _esc, _gb, _t, usd_formatter
from ..membar import (  # noqa: F401 - the bar's names, as the pages' tests know them here
    _UNGROUPED,
    BAR_WIDTH,
    NARROW_BAR_WIDTH,
    _breakdown_label,
    _figures,
    _r2,
    _term_looks,
    bar_geometry,
    memory_bar,
)
from ..results import BREAKDOWN_LABELS, offer_order_url
from ..texts import Texts, texts

register = template.Library()
register.simple_tag(memory_bar)


@register.filter
def gb(value, digits=1):
    """12.345 → '12.3'; None → '—'."""
    if value is None:
        return "—"
    return f"{value:,.{int(digits)}f}"


# --- building markup in Python, as the templates render it: sizing.markup's helpers ----

def _mode_word(code: str, tr: Texts) -> str:
    """``sizing_mode``, through the texts table."""
    return tr.pgettext("sizing mode", code) if code in MODE_WORDS else code


# (the gettext_noop calls stay outside the f-strings: makemessages does not look inside them)

@register.simple_tag
def recommendation_head(tokens, tr: Texts | None = None):
    """The <thead> of "Recommendation, cheapest first" (a Run column when tokens are given):
    the same for every answer in a language, so kept in its texts table."""
    tr = texts() if tr is None else tr
    key = ("rec-head", bool(tokens))
    if key in tr.extra:
        return tr.extra[key]
    offer, vram = _t(tr[gettext_noop("Offer")]), _t(tr[gettext_noop("VRAM")])
    mode, week = _t(tr[gettext_noop("Mode")]), _t(tr[gettext_noop("Week")])
    month, gpuh = _t(tr[gettext_noop("Month")]), _t(tr[gettext_noop("per GPU-h")])
    stock, order = _t(tr[gettext_noop("In stock")]), _t(tr[gettext_noop("Order")])
    run = ""
    if tokens:
        run_label = _t(tr[gettext_noop("Run")])
        run = f'<th scope="col" class="num">{run_label}</th>'
    value = tr.extra[key] = mark_safe(  # noqa: S308 - escaped translations
        f'<thead><tr><th scope="col">{offer}</th><th scope="col" class="num">{vram}</th><th scope="col">{mode}'
        f'</th>\n      <th scope="col" class="num">{week}</th><th scope="col" class="num">{month}</th>'
        f'<th scope="col" class="num">{gpuh}</th>\n      <th scope="col">{stock}</th>{run}'
        f'<th scope="col"><span class="sr-only">{order}</span></th></tr></thead>')
    return value


@register.simple_tag
def change_head(tr: Texts | None = None):
    """The <thead> of "Cheaper by changing one choice" (kept in the language's texts table)."""
    tr = texts() if tr is None else tr
    if "change-head" in tr.extra:
        return tr.extra["change-head"]
    change, offer = _t(tr[gettext_noop("Change")]), _t(tr[gettext_noop("Offer")])
    month, needs = _t(tr[gettext_noop("Month")]), _t(tr[gettext_noop("Needs")])
    trade, order = _t(tr[gettext_noop("Trade-off")]), _t(tr[gettext_noop("Order")])
    value = tr.extra["change-head"] = mark_safe(  # noqa: S308 - escaped translations
        f'<thead><tr><th scope="col">{change}</th><th scope="col">{offer}</th><th scope="col" class="num">'
        f'{month}</th><th scope="col" class="num">{needs}</th><th scope="col">{trade}</th><th scope="col">'
        f'<span class="sr-only">{order}</span></th></tr></thead>')
    return value


def _figure_text(tr: Texts, msgid: str, *names: str) -> str:
    """A ``{% blocktranslate %}`` text whose values are figures (digits, separators, "$", "—":
    nothing to escape), to fill with "%": the translation, or the English where the
    translation does not format with these names (as ``_bt`` falls back, decided once)."""
    translated = tr[msgid]
    try:
        translated % dict.fromkeys(names, "0")
    except (KeyError, ValueError):
        return msgid
    return translated


def _row_texts(tr: Texts) -> tuple:
    """The recommendation rows' labels and figure texts in the language (``_figure_text``),
    kept in its texts table: each row filled them through ``_bt`` and ``_t`` again."""
    try:
        return tr.extra["rec-row-texts"]
    except KeyError:
        pass
    recommended = _t(tr[gettext_noop("recommended")])  # outside the f-string, where makemessages finds it
    value = tr.extra["rec-row-texts"] = (
        _t(tr[gettext_noop("VRAM")]), _t(tr[gettext_noop("Mode")]), _t(tr[gettext_noop("Run")]),
        f' · <span class="badge ok">{recommended}</span>', _t(tr[gettext_noop("rental")]),
        _figure_text(tr, gettext_noop("%(h)s h"), "h"),
        _figure_text(tr, gettext_noop("likely %(lo)s–%(hi)s h"), "lo", "hi"),
        _figure_text(tr, gettext_noop("%(n)s tokens/s"), "n"),
        _figure_text(tr, gettext_noop("likely %(lo)s–%(hi)s"), "lo", "hi"),
        _figure_text(tr, gettext_noop("needs %(n)s/GPU"), "n"),
        _figure_text(tr, gettext_noop("micro-batch ≤ %(n)s"), "n"))
    return value


def _stock_badges(c, tr: Texts) -> str:
    stock = "".join(f'<span class="badge{" ok" if n else ""}">{_esc(site)} {_esc(n)}</span> '
                    for site, n in sorted_items(c.free_by_site))
    if not stock:
        none_free = _t(tr[gettext_noop("none free")])
        stock = f'<span class="badge warn">{none_free}</span>'
    return stock


def _per_offer(build):
    """``build(candidate, site)``, kept for the last 512 (offer, site) pairs by the offer's
    identity (the catalog's own objects, which a price or stock change replaces), checked on
    use: an lru_cache on the candidate hashed and compared its dozen fields on every look-up
    (three per row)."""
    kept: dict[tuple, tuple] = {}

    def get(c, site: str | None):
        key = (id(c), site)
        hit = kept.get(key)
        if hit is not None and hit[0] is c:
            return hit[1]
        value = build(c, site)
        if len(kept) >= 512:
            kept.clear()
        kept[key] = (c, value)
        return value

    return get


def offer_cells(tr: Texts):
    """``cells(candidate, site)``: what the rows show of an offer whatever the input — its
    name, VRAM, prices, stock badges and order link (for the requested site) — escaped, in
    the language of ``tr``. Kept in the language's texts table (dropped with it when the
    settings or catalogues change) for the last 512 (offer, site) pairs; the candidate is
    the key, every price and free count in it, so a stock or price change is a new key."""
    try:
        return tr.extra["offer-cells"]
    except KeyError:
        pass
    usd, usd_cents = usd_formatter(tr=tr), usd_formatter(always_cents=True, tr=tr)

    @_per_offer
    def cells(c, site: str | None) -> tuple[str, str, str, str, str, str, str]:
        gpus = f" ×{_esc(c.gpus)}" if c.gpus > 1 else ""
        return (_esc(c.offer_name), f"{_esc(c.vram_gb)} GB{gpus}", _esc(usd(c.weekly_cents)),
                _esc(usd(c.monthly_cents)), _esc(usd_cents(c.per_gpu_hour_cents)), _stock_badges(c, tr),
                _esc(offer_order_url(c, site)))

    tr.extra["offer-cells"] = cells
    return cells


def _row_cells(tr: Texts, cells):
    """``row(candidate, site)``: a recommendation row's price and stock cells up to its Run
    cell, and from it its order cell, as one text each (``offer_cells``' values, the
    language's labels); kept beside ``offer_cells`` in the language's texts table."""
    try:
        return tr.extra["row-cells"]
    except KeyError:
        pass
    l_week, l_month = _t(tr[gettext_noop("Week")]), _t(tr[gettext_noop("Month")])
    l_gpuh, l_stock = _t(tr[gettext_noop("per GPU-h")]), _t(tr[gettext_noop("In stock")])
    order = _t(tr[gettext_noop("Order this")])

    @_per_offer
    def row(c, site: str | None) -> tuple[str, str]:
        _, _, week, month, gpuh, stock, href = cells(c, site)
        return (f'        <td class="num" data-label="{l_week}">{week}</td>\n'
                f'        <td class="num" data-label="{l_month}">{month}</td>\n'
                f'        <td class="num" data-label="{l_gpuh}">{gpuh}</td>\n'
                f'        <td data-label="{l_stock}">{stock}</td>\n        ',
                f'\n        <td><a class="btn small" href="{href}">{order}</a></td>\n      </tr>')

    tr.extra["row-cells"] = row
    return row


@register.simple_tag
def recommendation_rows(result, tr: Texts | None = None):
    """The rows of "Recommendation, cheapest first" (``result.options``, the best first)."""
    tr = texts() if tr is None else tr
    usd, cells, site = usd_formatter(tr=tr), offer_cells(tr), result.request.site
    row_cells = _row_cells(tr, cells)
    (l_vram, l_mode, l_run, recommended, rental, t_hours, t_likely_h, t_tokens, t_likely, t_needs,
     t_micro) = _row_texts(tr)
    tokens = result.request.job.tokens
    rows = []
    for i, o in enumerate(result.options):
        e = o.estimate
        name, vram = cells(o.candidate, site)[:2]
        prices, order_cell = row_cells(o.candidate, site)
        tr_class, badge = (' class="best"', recommended) if i == 0 else ("", "")
        warnings = "".join([f'<br><small class="warn-note">{_esc(w)}</small>' for w in o.warnings])
        zero = f" · ZeRO-{_esc(e.zero)}" if e.zero and o.mode != "zero-3" else ""
        run = ""
        if tokens:
            hours = t_hours % {"h": _gb(o.run_hours)}
            extra = ""
            if o.run is not None:  # the range, and the offer's throughput
                lo, hi = o.run.hours_range
                clo, chi = o.run.rental_range_cents
                extra = (f'<br><small class="muted">{t_likely_h % {"lo": _gb(lo), "hi": _gb(hi)}}<br>'
                         f'{t_tokens % {"n": f"{round(o.run.speed.tokens_per_s):,}"}}</small>')
                if clo != chi:  # the lease terms often make the cost certain when the time is not
                    extra += f'<br><small class="muted">{t_likely % {"lo": usd(clo), "hi": usd(chi)}}</small>'
            run = (f'<td class="num" data-label="{l_run}">{hours}'
                   f'<br><small>{_esc(usd(o.rental_cost_cents))} {rental}</small>{extra}</td>')
        needs = t_needs % {"n": _gb(e.per_gpu_gb)}
        if o.max_micro_batch:
            needs += "<br>" + t_micro % {"n": _esc(o.max_micro_batch)}
        rows.append(
            f'\n      <tr{tr_class}>\n        <th scope="row">{name}'
            f'<br><small class="muted">{_esc(o.reason)}{badge}</small>\n          {warnings}</th>\n'
            f'        <td class="num" data-label="{l_vram}">{vram}<br><small class="muted">'
            f'{needs}</small></td>\n'
            f'        <td data-label="{l_mode}">{_esc(_mode_word(o.mode, tr))}{zero}</td>\n'
            f'{prices}{run}{order_cell}')
    return mark_safe("".join(rows))  # noqa: S308 - every value in it is escaped (_esc, _t) or a figure


@register.simple_tag
def change_rows(result, tr: Texts | None = None):
    """The rows of "Cheaper by changing one choice" (``result.changes``)."""
    tr = texts() if tr is None else tr
    cells, site = offer_cells(tr), result.request.site
    l_offer, l_month, l_needs, l_trade, order, t_needs = _change_texts(tr)
    rows = []
    for ch in result.changes:
        o = ch.option
        name, _, _, month, _, _, href = cells(o.candidate, site)
        mode = f' <small class="muted">({_esc(_mode_word(o.mode, tr))})</small>' if o.mode != "single" else ""
        needs = t_needs % {"n": _gb(o.estimate.per_gpu_gb)}
        rows.append(
            f'<tr>\n      <th scope="row">{_esc(ch.label)}</th>\n'
            f'      <td data-label="{l_offer}">{name}{mode}</td>\n'
            f'      <td class="num" data-label="{l_month}">{month}</td>\n'
            f'      <td class="num" data-label="{l_needs}">{needs}</td>\n'
            f'      <td data-label="{l_trade}">{_esc(ch.tradeoff)}</td>\n'
            f'      <td><a class="btn small" href="{href}">{order}</a></td>\n    </tr>')
    return mark_safe("".join(rows))  # noqa: S308 - every value in it is escaped (_esc, _t) or a figure


def _change_texts(tr: Texts) -> tuple:
    """The one-change rows' labels and figure text in the language (``_figure_text``), kept
    in its texts table."""
    try:
        return tr.extra["change-row-texts"]
    except KeyError:
        pass
    value = tr.extra["change-row-texts"] = (
        _t(tr[gettext_noop("Offer")]), _t(tr[gettext_noop("Month")]), _t(tr[gettext_noop("Needs")]),
        _t(tr[gettext_noop("Trade-off")]), _t(tr[gettext_noop("Order this")]),
        _figure_text(tr, gettext_noop("%(n)s GB/GPU"), "n"))
    return value


@register.simple_tag
def breakdown_rows(breakdown_gb, tr: Texts | None = None):
    """The rows of "The numbers, per GPU": each term's label and GB (two decimals)."""
    tr = texts() if tr is None else tr
    values = tuple(breakdown_gb.values())
    if sum(map(abs, values)) < _UNGROUPED:  # "%.2f" writes what ",.2f" writes: one call for all rows
        return mark_safe(_breakdown_template(tr, tuple(breakdown_gb)) % values)  # noqa: S308 - escaped labels
    looks = _term_looks(tr)
    return mark_safe("".join(  # noqa: S308 - escaped labels, formatted numbers
        f'<tr><th scope="row">{looks[key][1]}</th><td class="num">{_gb(v, 2)} GB</td></tr>'
        for key, v in breakdown_gb.items()))


def _breakdown_template(tr: Texts, keys: tuple) -> str:
    """The breakdown's rows for these terms, each GB a "%.2f" (the engine gives the same dozen
    terms in the same order on every answer), kept in the language's texts table."""
    cache_key = ("breakdown-rows", keys)
    try:
        return tr.extra[cache_key]
    except KeyError:
        looks = _term_looks(tr)
        value = tr.extra[cache_key] = "".join(
            f'<tr><th scope="row">{looks[key][1].replace("%", "%%")}</th><td class="num">%.2f GB</td></tr>'
            for key in keys)
        return value


@register.filter
def sorted_items(mapping):
    return sorted(mapping.items()) if mapping else []


@register.filter
def order_url(result, option):
    """``{{ result|order_url:option }}`` → /order/<offer_slug>/?site=<site>."""
    return result.order_url(option)


@register.filter
def breakdown_label(key):
    return BREAKDOWN_LABELS.get(key, key)


@register.filter
def pct(fraction):
    """0.3 → '30%'."""
    return f"{fraction * 100:.0f}%"


@register.filter
def billions(count):
    """6738415616 → '6.74'."""
    return f"{count / 1e9:,.2f}"


@register.simple_tag
def calculator_url(query: dict) -> str:
    """The calculator with these inputs: a figure of the pages, opened where it is computed."""
    from urllib.parse import urlencode

    from django.urls import reverse

    return f"{reverse('sizing')}?{urlencode(query)}"


#: The engine's mode and method codes, as a reader of the page's language says them; English
#: keeps the codes (they are the API's values), Chinese gets words.
MODE_WORDS = {"single": pgettext_lazy("sizing mode", "single"),
              "data-parallel": pgettext_lazy("sizing mode", "data-parallel"),
              "zero-3": pgettext_lazy("sizing mode", "zero-3")}
METHOD_WORDS = {"full": pgettext_lazy("sizing method", "full"),
                "full-8bit": pgettext_lazy("sizing method", "full-8bit"),
                "lora": pgettext_lazy("sizing method", "lora"),
                "qlora": pgettext_lazy("sizing method", "qlora")}


@register.filter
def sizing_mode(code: str) -> str:
    return str(MODE_WORDS.get(code, code))


@register.filter
def sizing_method(code: str) -> str:
    return str(METHOD_WORDS.get(code, code))
