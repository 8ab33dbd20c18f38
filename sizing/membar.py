"""The calculator's memory bar: the per-GPU breakdown drawn as SVG against a card, wide and
narrow (site.css shows the one that fits), with its legend; the template library
``sizing_tags`` offers it as ``{% memory_bar %}``, ``sizing.fragment`` calls it directly.

Written in Python as the template wrote it (tests/sizing/test_fast_paths.py holds it to the
dict-based builder it replaced): a drawing's ~30 positions and the terms' figures are each
formatted in one "%" call where that writes what the per-number format wrote, since a
float's formatting is most of a drawing's cost.
"""

from django.utils.safestring import mark_safe
from django.utils.translation import gettext_noop

from .markup import _bt, _dot_decimals, _esc, _gb
from .recommend import usable_gb
from .results import BREAKDOWN_LABELS, BREAKDOWN_MSGIDS
from .texts import Texts, texts

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


def _breakdown_label(key: str, tr: Texts) -> str:
    """A breakdown term's label in the language (``BREAKDOWN_LABELS``' msgids), or its key."""
    msgid = BREAKDOWN_MSGIDS.get(key)
    return key if msgid is None else tr[msgid]


def memory_bar(estimate, card=None, caption="", tr: Texts | None = None):
    """``{% memory_bar option.estimate option.candidate caption %}``: ``memory_bar_parts``
    joined."""
    return mark_safe("".join(memory_bar_parts(estimate, card, caption, tr)))  # noqa: S308 - escaped parts


def memory_bar_parts(estimate, card=None, caption="", tr: Texts | None = None):
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
    # each term over 0: (gb, its segment's markup up to its GB, its legend entry's up to its GB)
    heads = _term_heads(tr)
    shown = [(gb, heads[key]) for key, gb in estimate.breakdown_gb.items() if gb > 0]
    gb1s, gb2s = _figures([gb for gb, _ in shown])
    need = _gb(per_gpu_gb)
    title = _bt(tr, gettext_noop("Memory per GPU: %(need)s GB"), need=need)
    card_texts = None
    if card:
        title_card, card_texts = _card_texts(card, tr)
        title += title_card
    needs = _bt(tr, gettext_noop("needs %(need)s GB per GPU"), need=need)
    figcaption = f"<figcaption>{_esc(caption)}</figcaption>" if caption else ""
    legend = "".join([f"{legend_head}{gb2} GB</span></li>"
                      for (_, (_, legend_head)), gb2 in zip(shown, gb2s, strict=True)])
    # what a segment writes after its x and width, and its text after its middle: the same in
    # both drawings, so written once
    segs = [(gb, f'{seg_head}{gb2} GB</title></rect>\n    ', f'{_TEXT_AFTER_X}{gb1}</text>')
            for (gb, (seg_head, _)), gb1, gb2 in zip(shown, gb1s, gb2s, strict=True)]
    # both drawings' positions in one pass where the language writes decimals with "."
    bodies = _fast_bodies(segs, per_gpu_gb, card_gb, card_texts) if dot else None
    wide, narrow = (None, None) if bodies is None else bodies
    # in parts, so that the ASCII ones (most of it) stay ASCII: ``sizing.fragment.results_bytes``
    return ['<figure class="membar">\n',
            *_drawing(segs, per_gpu_gb, card_gb, card_texts, BAR_WIDTH, title, needs, dot, wide),
            *_drawing(segs, per_gpu_gb, card_gb, card_texts, NARROW_BAR_WIDTH, title, needs, dot, narrow),
            f"\n{figcaption}\n", f'<ul class="membar-legend">\n  {legend}\n</ul>\n</figure>\n']


#: a segment's text after its x (the text's y and look), up to its GB
_TEXT_AFTER_X = f'" y="{BAR_Y + 21}" text-anchor="middle" font-size="11" fill="#fff">'
#: below this sum of sizes no figure needs a thousands separator, and none is nan or inf
_UNGROUPED = 999.0


def _figures(values: list) -> tuple[list, list]:
    """(``f"{v:,.1f}"``, ``f"{v:,.2f}"``) of each value: where none needs a thousands separator
    (nor is nan or inf) "%" writes the same digits, for all the values in one call each."""
    if sum(map(abs, values)) < _UNGROUPED:
        k, t = len(values), tuple(values)
        return (("%.1f\x01" * k) % t).split("\x01")[:-1], (("%.2f\x01" * k) % t).split("\x01")[:-1]
    return [f"{v:,.1f}" for v in values], [f"{v:,.2f}" for v in values]


class _TermHeads(dict):
    """breakdown key → (its bar segment's markup after its width, up to its GB; its legend
    entry's, up to its GB), in one language (``_term_heads``)."""

    def __init__(self, tr: Texts):
        super().__init__()
        self.looks = _term_looks(tr)

    def __missing__(self, key: str) -> tuple[str, str]:
        colour, label = self.looks[key]
        value = self[key] = (
            f'" height="{BAR_H}" fill="{colour}" stroke="#fff" stroke-width="1"><title>{label}: ',
            f'<li><span class="swatch" style="background:{colour}"></span>{label} <span class="num">')
        return value


def _term_heads(tr: Texts) -> _TermHeads:
    """What the bar and its legend write of a term before its GB, kept in the language's texts
    table (every answer shows the same dozen terms)."""
    try:
        return tr.extra["term-heads"]
    except KeyError:
        value = tr.extra["term-heads"] = _TermHeads(tr)
        return value


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


#: follows each bar position written as "%.2f" (``_fast_bodies``): the text of
#: ``repr(round(x, 2))`` is that with a last "0" dropped, which one ``str.replace`` does for
#: all ~30 positions of a drawing instead of a call per position
_CUT = "\x01"
#: below this size a position's ``f"{x:.2f}"`` stripped as ``_r2`` strips it is its rounded repr
_PLAIN = 1e13


def _drawing(segs: list, per_gpu_gb: float, card_gb, card_texts, width: int, title: str, needs: str,
             dot: bool, body: str | None = None) -> tuple[str, str]:
    """One <svg> of the bar (the wide or the narrow drawing), at ``bar_geometry``'s
    positions: the same scale, each segment's x, width and middle rounded to 0.01; in two
    parts, up to its title and after it (the title names the card, often not in ASCII).
    ``segs``: (GB, the segment's markup after its width, its text's after its x) per term;
    ``body``: its card and segments as ``_fast_bodies`` wrote them (None: written here)."""
    variant, needs_y, view_h = ("narrow", BAR_Y + BAR_H + 40, 98) if width < BAR_WIDTH else (
        "wide", BAR_Y + BAR_H + 26, 84)
    if body is None:
        scale = width / (max(per_gpu_gb, card_gb or 0) * 1.04 or 1.0)
        body = _segments_and_card(segs, scale, card_texts, card_gb, dot)
    return ((f'\n<svg viewBox="-4 0 {width + 8} {view_h}" width="100%" role="img" '
             f'aria-labelledby="membar-title-{variant}" class="chart-{variant}" '
             f'xmlns="http://www.w3.org/2000/svg">\n  <title id="membar-title-{variant}">{title}</title>\n'),
            f'  {body}\n  <text x="0" y="{needs_y}" font-size="11" fill="#5a6472">{needs}</text>\n</svg>\n')


def _fast_bodies(segs: list, per_gpu_gb: float, card_gb, card_texts) -> tuple[str, str] | None:
    """The wide and the narrow drawings' cards and segments (``_segments_and_card`` of each)
    where the language writes decimals with "." and every position is a plain number (their
    sizes summed below ``_PLAIN``: none is nan or inf); None where one is not (that path
    writes it). The narrow drawing's scale is half the wide one's, and halving a float is
    exact, so every narrow position is its wide one times 0.5, to the bit: the positions are
    worked out once and all of both drawings' formatted in one "%" call, each repr's last zero
    dropped at once (``_CUT``)."""
    scale = BAR_WIDTH / (max(per_gpu_gb, card_gb or 0) * 1.04 or 1.0)
    values, x = [], 0.0
    for gb, _, _ in segs:
        w = gb * scale
        values += (x, w, x + w / 2)
        x += w
    if card_texts is not None:
        values += (card_texts[0] * scale, card_gb * scale)
    if not sum(map(abs, values)) < _PLAIN:
        return None
    n = len(values)
    values += [v * 0.5 for v in values]
    texts_ = (("%.2f\x01" * (2 * n)) % tuple(values)).replace("0\x01", _CUT).split(_CUT)
    return _fast_body(segs, values, texts_, 0, card_texts), _fast_body(segs, values, texts_, n, card_texts)


def _fast_body(segs: list, values: list, texts_: list, i: int, card_texts) -> str:
    """One drawing's card and segments from its positions (``values``, formatted in
    ``texts_``) starting at ``i``: x, width and middle per segment, then the card's lines."""
    parts = []
    for _, rest, text_rest in segs:
        if values[i + 1] >= MIN_TEXT_PX:
            parts.append(f'{_SEG_X}{texts_[i]}{_SEG_W}{texts_[i + 1]}{rest}<text x="{texts_[i + 2]}{text_rest}'
                         f'\n  </g>')
        else:
            parts.append(f'{_SEG_X}{texts_[i]}{_SEG_W}{texts_[i + 1]}{rest}\n  </g>')
        i += 3
    card_rect = card_lines = ""
    if card_texts is not None:
        card_rect, card_lines = _card_markup(texts_[i], texts_[i + 1], card_texts[1], card_texts[2])
    return f'{card_rect}\n  {"".join(parts)}\n  {card_lines}'


#: a segment's markup up to its x, and between its x and its width
_SEG_X = '<g class="membar-seg">\n    <rect x="'
_SEG_W = f'" y="{BAR_Y}" width="'


def _segments_and_card(segs: list, scale: float, card_texts, card_gb, dot: bool) -> str:
    """The drawing's card outline, segments and card lines, each position through ``_r2``."""
    y = BAR_Y
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
        card_rect, card_lines = _card_markup(ux, cx, usable_text, vram_text)
    return f'{card_rect}\n  {"".join(segments)}\n  {card_lines}'


def _card_markup(ux: str, cx: str, usable_text: str, vram_text: str) -> tuple[str, str]:
    """(the card's outline, its usable and VRAM lines with their labels) at these positions."""
    y, h, bottom = BAR_Y, BAR_H, BAR_Y + BAR_H
    return ((f'<rect class="membar-card" x="0" y="{y}" width="{cx}" height="{h}" '
             f'fill="#f3f5f8" stroke="#9aa4b2"/>'),
            (f'\n  <line x1="{ux}" x2="{ux}" y1="12" y2="{bottom + 8}" stroke="#b3261e" stroke-width="2" '
             f'stroke-dasharray="4 3"/>\n  <text x="{ux}" y="10" text-anchor="end" font-size="11" '
             f'fill="#b3261e">{usable_text}</text>\n'
             f'  <line x1="{cx}" x2="{cx}" y1="{y}" y2="{bottom + 14}" stroke="#14181f" stroke-width="2"/>\n'
             f'  <text x="{cx}" y="{bottom + 26}" text-anchor="end" font-size="11" fill="#14181f">{vram_text}'
             f'</text>\n  '))
