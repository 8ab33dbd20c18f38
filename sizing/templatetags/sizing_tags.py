"""Template helpers for the sizing pages: the server-rendered SVG memory bar and the
calculator's per-row tables (recommendations, one-change plans, the breakdown).

The bar and the rows are built here in Python rather than in templates: a cold
calculator fragment spent most of its time in the template engine resolving the same
variables, filters and {% translate %} tags once per segment and row. The builders write
exactly the markup the templates wrote (tests/sizing/test_golden.py compares byte for
byte) with the templates' escaping rules — ``{{ value }}`` and ``{% translate %}`` are
escaped, a ``{% blocktranslate %}``'s text is not but its variables are — and the same
msgids, so the zh_Hans catalogue still applies. Each text is translated once per call.
"""

import functools

from django import template
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_noop, pgettext_lazy

from ..markup import _bt, _dot_decimals, _esc, _gb, _t, usd_formatter
from ..recommend import usable_gb
from ..results import BREAKDOWN_LABELS, BREAKDOWN_MSGIDS, offer_order_url
from ..texts import Texts, texts

register = template.Library()

BAR_WIDTH = 640
#: The phone drawing, whose 11-unit labels stay 11 px or more in a 320 px column
#: (the 640-unit one drew them at 6 px there); site.css shows one of the two
NARROW_BAR_WIDTH = 320
BAR_Y, BAR_H = 22, 34
#: one colour per breakdown term (colour-blind-safe order: Okabe–Ito, then greys)
COLOURS = {
    "frozen_weights": "#0072b2", "trainable_weights": "#56b4e9", "gradients": "#009e73",
    "fp32_master": "#e69f00", "optimizer_states": "#d55e00", "adapters": "#cc79a7",
    "sharding_buffers": "#f0e442", "activations": "#6a3d9a", "logits": "#b15928",
    "cuda_context": "#7f7f7f", "allocator_margin": "#bdbdbd",
}
#: a segment narrower than this (px) carries no text inside; its legend entry does
MIN_TEXT_PX = 44


def _segments(breakdown: dict, scale: float) -> list[dict]:
    x, out = 0.0, []
    for key, gb in breakdown.items():
        if gb <= 0:
            continue
        w = gb * scale
        out.append({"key": key, "label": BREAKDOWN_LABELS.get(key, key), "gb": gb,
                    "x": round(x, 2), "w": round(w, 2), "mid": round(x + w / 2, 2),
                    "colour": COLOURS.get(key, "#999"), "text": w >= MIN_TEXT_PX})
        x += w
    return out


def bar_geometry(breakdown: dict, per_gpu_gb: float, card_gb: float | None, width: int = BAR_WIDTH) -> dict:
    """Pixel positions for the stacked bar: segments, the card's edge and usable line. The
    narrow drawing puts "needs … per GPU" on a line of its own, clear of the card's label."""
    top = max(per_gpu_gb, card_gb or 0) * 1.04 or 1.0
    scale = width / top
    narrow = width < BAR_WIDTH
    bottom = BAR_Y + BAR_H
    geo = {"width": width, "y": BAR_Y, "h": BAR_H, "bottom": bottom,
           "segments": _segments(breakdown, scale), "per_gpu_gb": per_gpu_gb,
           "card_gb": card_gb, "fits": True, "variant": "narrow" if narrow else "wide",
           "needs_y": bottom + (40 if narrow else 26), "view_h": 98 if narrow else 84}
    if card_gb:
        usable = usable_gb(card_gb)
        geo.update(card_x=round(card_gb * scale, 2), usable_gb=usable,
                   usable_x=round(usable * scale, 2), fits=per_gpu_gb <= usable)
    return geo


@register.filter
def gb(value, digits=1):
    """12.345 → '12.3'; None → '—'."""
    if value is None:
        return "—"
    return f"{value:,.{int(digits)}f}"


# --- building markup in Python, as the templates render it: sizing.markup's helpers ----

def _breakdown_label(key: str, tr: Texts) -> str:
    """A breakdown term's label in the language (``BREAKDOWN_LABELS``' msgids), or its key."""
    msgid = BREAKDOWN_MSGIDS.get(key)
    return key if msgid is None else tr[msgid]


def _mode_word(code: str, tr: Texts) -> str:
    """``sizing_mode``, through the texts table."""
    return tr.pgettext("sizing mode", code) if code in MODE_WORDS else code


@register.simple_tag
def memory_bar(estimate, card=None, caption="", tr: Texts | None = None):
    """``{% memory_bar option.estimate option.candidate caption %}``: the per-GPU breakdown
    against a card, drawn wide and narrow (site.css shows the one that fits), and
    its legend; the drawing and each segment carry a <title> (the accessible name).

    The drawings' positions are ``bar_geometry``'s; the markup is written from them in one
    pass, and what both drawings share (each term's label, colour and figures, the
    card's texts) is written once (tests/sizing/test_fast_paths.py holds the two to the
    dict-based builder this replaced)."""
    tr = texts() if tr is None else tr
    dot = _dot_decimals(tr)
    per_gpu_gb = estimate.per_gpu_gb
    card_gb = card.vram_gb if card is not None else None
    # (gb, colour, label, the gb as the bar's text and as the title's) of each term over 0
    looks = _term_looks(tr)
    terms = [(gb, *looks[key], f"{gb:,.1f}", f"{gb:,.2f}") for key, gb in estimate.breakdown_gb.items() if gb > 0]
    need = _gb(per_gpu_gb)
    title = _bt(tr, gettext_noop("Memory per GPU: %(need)s GB"), need=need)
    card_texts = None
    if card:
        title_card, card_texts = _card_texts(card, tr)
        title += title_card
    needs = _bt(tr, gettext_noop("needs %(need)s GB per GPU"), need=need)
    figcaption = f"<figcaption>{_esc(caption)}</figcaption>" if caption else ""
    legend = "".join(f'<li><span class="swatch" style="background:{colour}"></span>{label} '
                     f'<span class="num">{gb2} GB</span></li>' for _, colour, label, _, gb2 in terms)
    # what a segment writes after its x and width, and its text after its middle: the same in
    # both drawings, so written once
    segs = [(gb, f'" height="{BAR_H}" fill="{colour}" stroke="#fff" stroke-width="1"><title>{label}: {gb2} GB'
                 f'</title></rect>\n    ',
             f'" y="{BAR_Y + 21}" text-anchor="middle" font-size="11" fill="#fff">{gb1}</text>')
            for gb, colour, label, gb1, gb2 in terms]
    drawings = "".join(_drawing(segs, per_gpu_gb, card_gb, card_texts, width, title, needs, dot)
                       for width in (BAR_WIDTH, NARROW_BAR_WIDTH))
    return mark_safe(  # noqa: S308 - every value in it is escaped (_esc, _bt)
        f'<figure class="membar">\n{drawings}\n{figcaption}\n<ul class="membar-legend">\n  {legend}\n</ul>\n'
        f'</figure>\n')


def _card_texts(card, tr: Texts) -> tuple[str, tuple | None]:
    """(the title's " · card, VRAM" part, (usable GB, its label, the card's label) or None
    without VRAM) of a card: the same on every answer drawn on it, so kept in the language's
    texts table, by the two values they are written from."""
    key = ("membar-card", card.gpu_name, card.vram_gb)
    extra = tr.extra
    if key in extra:
        return extra[key]
    title = " · " + _bt(tr, gettext_noop("%(name)s, %(vram)s GB"), name=card.gpu_name, vram=card.vram_gb)
    texts_ = None
    if card.vram_gb:
        usable = usable_gb(card.vram_gb)
        texts_ = (usable, _bt(tr, gettext_noop("usable %(u)s GB"), u=_gb(usable)),
                  _bt(tr, gettext_noop("card %(v)s GB"), v=card.vram_gb))
    extra[key] = value = (title, texts_)
    return value


class _TermLooks(dict):
    """breakdown key → (its colour, its label), escaped, in one language (``_term_looks``)."""

    def __init__(self, tr: Texts):
        super().__init__()
        self.tr = tr

    def __missing__(self, key: str) -> tuple[str, str]:
        value = self[key] = (_esc(COLOURS.get(key, "#999")), _esc(_breakdown_label(key, self.tr)))
        return value


def _term_looks(tr: Texts) -> _TermLooks:
    """What the bar and the breakdown show of a term whatever its size, kept in the language's
    texts table (every answer shows the same dozen terms)."""
    try:
        return tr.extra["term-looks"]
    except KeyError:
        value = tr.extra["term-looks"] = _TermLooks(tr)
        return value


def _num(value: float, dot: bool) -> str:
    """``_esc`` of a float: its repr where the language writes decimals with "."."""
    text = repr(value)
    return text if dot and "e" not in text and "n" not in text else _esc(value, dot)


def _r2(x: float) -> str:
    """``repr(round(x, 2))``: below 1e13 (at most 15 digits, each such decimal its own float)
    the same text from one correctly rounded formatting instead of round's and repr's."""
    if -1e13 < x < 1e13:
        text = f"{x:.2f}".rstrip("0")
        return text + "0" if text[-1] == "." else text
    return repr(round(x, 2))


def _drawing(segs: list, per_gpu_gb: float, card_gb, card_texts, width: int, title: str, needs: str,
             dot: bool) -> str:
    """One <svg> of the bar (the wide or the narrow drawing), at ``bar_geometry``'s
    positions: the same scale, each segment's x, width and middle rounded to 0.01.
    ``segs``: (GB, the segment's markup after its width, its text's after its x) per term."""
    top = max(per_gpu_gb, card_gb or 0) * 1.04 or 1.0
    scale = width / top
    variant, needs_y, view_h = ("narrow", BAR_Y + BAR_H + 40, 98) if width < BAR_WIDTH else (
        "wide", BAR_Y + BAR_H + 26, 84)
    y, h, bottom = BAR_Y, BAR_H, BAR_Y + BAR_H
    segments, x = [], 0.0
    for gb, rest, text_rest in segs:
        w = gb * scale
        # _num inlined (three numbers a segment, two drawings): a rounded float's repr, else _esc
        xs, ws = _r2(x), _r2(w)
        if not dot or "e" in xs or "e" in ws or "n" in xs or "n" in ws:
            xs, ws = _num(round(x, 2), dot), _num(round(w, 2), dot)
        text = ""
        if w >= MIN_TEXT_PX:
            ms = _r2(x + w / 2)
            if not dot or "e" in ms or "n" in ms:
                ms = _num(round(x + w / 2, 2), dot)
            text = f'<text x="{ms}{text_rest}'
        segments.append(f'<g class="membar-seg">\n    <rect x="{xs}" y="{y}" width="{ws}{rest}{text}\n  </g>')
        x += w
    card_rect = card_lines = ""
    if card_texts is not None:
        usable, usable_text, vram_text = card_texts
        ux, cx = _num(round(usable * scale, 2), dot), _num(round(card_gb * scale, 2), dot)
        card_rect = (f'<rect class="membar-card" x="0" y="{y}" width="{cx}" height="{h}" '
                     f'fill="#f3f5f8" stroke="#9aa4b2"/>')
        card_lines = (
            f'\n  <line x1="{ux}" x2="{ux}" y1="12" y2="{bottom + 8}" stroke="#b3261e" stroke-width="2" '
            f'stroke-dasharray="4 3"/>\n  <text x="{ux}" y="10" text-anchor="end" font-size="11" '
            f'fill="#b3261e">{usable_text}</text>\n'
            f'  <line x1="{cx}" x2="{cx}" y1="{y}" y2="{bottom + 14}" stroke="#14181f" stroke-width="2"/>\n'
            f'  <text x="{cx}" y="{bottom + 26}" text-anchor="end" font-size="11" fill="#14181f">{vram_text}</text>\n  ')
    return (f'\n<svg viewBox="-4 0 {width + 8} {view_h}" width="100%" role="img" '
            f'aria-labelledby="membar-title-{variant}" class="chart-{variant}" '
            f'xmlns="http://www.w3.org/2000/svg">\n  <title id="membar-title-{variant}">{title}</title>\n'
            f'  {card_rect}\n  {"".join(segments)}\n  {card_lines}\n  <text x="0" y="{needs_y}" '
            f'font-size="11" fill="#5a6472">{needs}</text>\n</svg>\n')


# (the gettext_noop calls stay outside the f-strings: makemessages does not look inside them)

@register.simple_tag
def recommendation_head(tokens, tr: Texts | None = None):
    """The <thead> of "Recommendation, cheapest first" (a Run column when tokens are given)."""
    tr = texts() if tr is None else tr
    offer, vram = _t(tr[gettext_noop("Offer")]), _t(tr[gettext_noop("VRAM")])
    mode, week = _t(tr[gettext_noop("Mode")]), _t(tr[gettext_noop("Week")])
    month, gpuh = _t(tr[gettext_noop("Month")]), _t(tr[gettext_noop("per GPU-h")])
    stock, order = _t(tr[gettext_noop("In stock")]), _t(tr[gettext_noop("Order")])
    run = ""
    if tokens:
        run_label = _t(tr[gettext_noop("Run")])
        run = f'<th scope="col" class="num">{run_label}</th>'
    return mark_safe(  # noqa: S308 - escaped translations
        f'<thead><tr><th scope="col">{offer}</th><th scope="col" class="num">{vram}</th><th scope="col">{mode}'
        f'</th>\n      <th scope="col" class="num">{week}</th><th scope="col" class="num">{month}</th>'
        f'<th scope="col" class="num">{gpuh}</th>\n      <th scope="col">{stock}</th>{run}'
        f'<th scope="col"><span class="sr-only">{order}</span></th></tr></thead>')


@register.simple_tag
def change_head(tr: Texts | None = None):
    """The <thead> of "Cheaper by changing one choice"."""
    tr = texts() if tr is None else tr
    change, offer = _t(tr[gettext_noop("Change")]), _t(tr[gettext_noop("Offer")])
    month, needs = _t(tr[gettext_noop("Month")]), _t(tr[gettext_noop("Needs")])
    trade, order = _t(tr[gettext_noop("Trade-off")]), _t(tr[gettext_noop("Order")])
    return mark_safe(  # noqa: S308 - escaped translations
        f'<thead><tr><th scope="col">{change}</th><th scope="col">{offer}</th><th scope="col" class="num">'
        f'{month}</th><th scope="col" class="num">{needs}</th><th scope="col">{trade}</th><th scope="col">'
        f'<span class="sr-only">{order}</span></th></tr></thead>')


def _stock_badges(c, tr: Texts) -> str:
    stock = "".join(f'<span class="badge{" ok" if n else ""}">{_esc(site)} {_esc(n)}</span> '
                    for site, n in sorted_items(c.free_by_site))
    if not stock:
        none_free = _t(tr[gettext_noop("none free")])
        stock = f'<span class="badge warn">{none_free}</span>'
    return stock


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

    @functools.lru_cache(maxsize=512)
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

    @functools.lru_cache(maxsize=512)
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
    l_vram, l_mode = _t(tr[gettext_noop("VRAM")]), _t(tr[gettext_noop("Mode")])
    l_run, recommended = _t(tr[gettext_noop("Run")]), _t(tr[gettext_noop("recommended")])
    rental = _t(tr[gettext_noop("rental")])
    tokens = result.request.job.tokens
    rows = []
    for i, o in enumerate(result.options):
        e = o.estimate
        name, vram = cells(o.candidate, site)[:2]
        prices, order_cell = row_cells(o.candidate, site)
        tr_class, badge = (' class="best"', f' · <span class="badge ok">{recommended}</span>') if i == 0 else ("", "")
        warnings = "".join(f'<br><small class="warn-note">{_esc(w)}</small>' for w in o.warnings)
        zero = f" · ZeRO-{_esc(e.zero)}" if e.zero and o.mode != "zero-3" else ""
        run = ""
        if tokens:
            hours = _bt(tr, gettext_noop("%(h)s h"), h=_gb(o.run_hours))
            extra = ""
            if o.run is not None:  # the range, and the offer's throughput
                lo, hi = o.run.hours_range
                clo, chi = o.run.rental_range_cents
                extra = ("<br><small class=\"muted\">"
                         + _bt(tr, gettext_noop("likely %(lo)s–%(hi)s h"), lo=_gb(lo), hi=_gb(hi)) + "<br>"
                         + _bt(tr, gettext_noop("%(n)s tokens/s"), n=f"{round(o.run.speed.tokens_per_s):,}")
                         + "</small>")
                if clo != chi:  # the lease terms often make the cost certain when the time is not
                    cost_range = _bt(tr, gettext_noop("likely %(lo)s–%(hi)s"), lo=usd(clo), hi=usd(chi))
                    extra += f'<br><small class="muted">{cost_range}</small>'
            run = (f'<td class="num" data-label="{l_run}">{hours}'
                   f'<br><small>{_esc(usd(o.rental_cost_cents))} {rental}</small>{extra}</td>')
        needs = _bt(tr, gettext_noop("needs %(n)s/GPU"), n=_gb(e.per_gpu_gb))
        if o.max_micro_batch:
            needs += "<br>" + _bt(tr, gettext_noop("micro-batch ≤ %(n)s"), n=o.max_micro_batch)
        rows.append(
            f'\n      <tr{tr_class}>\n        <th scope="row">{name}'
            f'<br><small class="muted">{_esc(o.reason)}{badge}</small>\n          {warnings}</th>\n'
            f'        <td class="num" data-label="{l_vram}">{vram}<br><small class="muted">'
            f'{needs}</small></td>\n'
            f'        <td data-label="{l_mode}">{_esc(_mode_word(o.mode, tr))}{zero}</td>\n'
            f'{prices}{run}{order_cell}')
    return mark_safe("".join(rows))  # noqa: S308 - every value in it is escaped (_esc, _t, _bt)


@register.simple_tag
def change_rows(result, tr: Texts | None = None):
    """The rows of "Cheaper by changing one choice" (``result.changes``)."""
    tr = texts() if tr is None else tr
    cells, site = offer_cells(tr), result.request.site
    l_offer, l_month = _t(tr[gettext_noop("Offer")]), _t(tr[gettext_noop("Month")])
    l_needs, l_trade = _t(tr[gettext_noop("Needs")]), _t(tr[gettext_noop("Trade-off")])
    order = _t(tr[gettext_noop("Order this")])
    rows = []
    for ch in result.changes:
        o = ch.option
        name, _, _, month, _, _, href = cells(o.candidate, site)
        mode = f' <small class="muted">({_esc(_mode_word(o.mode, tr))})</small>' if o.mode != "single" else ""
        needs = _bt(tr, gettext_noop("%(n)s GB/GPU"), n=_gb(o.estimate.per_gpu_gb))
        rows.append(
            f'<tr>\n      <th scope="row">{_esc(ch.label)}</th>\n'
            f'      <td data-label="{l_offer}">{name}{mode}</td>\n'
            f'      <td class="num" data-label="{l_month}">{month}</td>\n'
            f'      <td class="num" data-label="{l_needs}">{needs}</td>\n'
            f'      <td data-label="{l_trade}">{_esc(ch.tradeoff)}</td>\n'
            f'      <td><a class="btn small" href="{href}">{order}</a></td>\n    </tr>')
    return mark_safe("".join(rows))  # noqa: S308 - every value in it is escaped (_esc, _t, _bt)


@register.simple_tag
def breakdown_rows(breakdown_gb, tr: Texts | None = None):
    """The rows of "The numbers, per GPU": each term's label and GB (two decimals)."""
    looks = _term_looks(texts() if tr is None else tr)
    return mark_safe("".join(  # noqa: S308 - escaped labels, formatted numbers
        f'<tr><th scope="row">{looks[key][1]}</th><td class="num">{_gb(v, 2)} GB</td></tr>'
        for key, v in breakdown_gb.items()))


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
