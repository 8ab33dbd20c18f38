"""Small server-rendered SVG charts for the storefront (no JavaScript, no images).

``{% availability_chart rows sites %}`` draws free units per site per offer as horizontal
stacked bars: one bar per offer, one coloured segment per site, the total at the end.
``rows`` are catalog rows (``.offer`` and ``.free_by_site``) or ``(offer, {site: n})`` pairs
as the GPU page has them; ``sites`` (objects with ``.code``, or codes) fixes the order and the
colours, else the sites found in the rows are used in alphabetical order.
"""
from dataclasses import dataclass

from django import template

register = template.Library()

#: One colour per site, in site order; white text on each is WCAG AA (≥ 4.5:1).
SITE_COLOURS = ("#0b5cd5", "#0f766e", "#7c3aed", "#b45309", "#be185d", "#4d5b6b")
WIDTH, LABEL_W, TOTAL_W = 400, 112, 40
ROW_H, BAR_H, TOP = 26, 16, 30


@dataclass
class Segment:
    site: str
    n: int
    x: int
    w: int
    colour: str

    @property
    def mid(self) -> int:
        return self.x + self.w // 2

    @property
    def show_text(self) -> bool:
        return self.w >= 16 + 7 * len(str(self.n))


def _normalise(rows):
    for row in rows:
        if isinstance(row, (tuple, list)):
            offer, free = row[0], row[1]
        else:
            offer, free = row.offer, row.free_by_site
        yield (getattr(offer, "display_name", str(offer)), dict(free or {}))


def availability_layout(rows, sites=None) -> dict:
    data = list(_normalise(rows))
    if sites is None:
        codes = sorted({code for _, free in data for code in free})
    else:
        codes = [getattr(s, "code", s) for s in sites]
    colours = {code: SITE_COLOURS[i % len(SITE_COLOURS)] for i, code in enumerate(codes)}
    bar_w = WIDTH - LABEL_W - TOTAL_W
    peak = max([sum(free.get(c, 0) for c in codes) for _, free in data] or [0]) or 1
    bars = []
    for i, (label, free) in enumerate(data):
        y = TOP + i * ROW_H
        x, segments = LABEL_W, []
        for code in codes:
            n = free.get(code, 0)
            if n <= 0:
                continue
            w = max(2, round(bar_w * n / peak))
            segments.append(Segment(code, n, x, w, colours[code]))
            x += w
        total = sum(s.n for s in segments)
        bars.append({"label": label, "y": y, "text_y": y + BAR_H // 2 + 5, "segments": segments,
                     "total": total, "end_x": x + 6, "counts": [free.get(c, 0) for c in codes]})
    legend, lx = [], LABEL_W
    for code in codes:
        legend.append({"code": code, "x": lx, "colour": colours[code]})
        lx += 16 + 8 * len(code) + 14
    return {
        "bars": bars, "legend": legend, "codes": codes, "width": WIDTH, "bar_h": BAR_H,
        "label_x": LABEL_W - 8, "height": TOP + len(data) * ROW_H + 4, "empty": not any(b["total"] for b in bars),
    }


@register.inclusion_tag("inventory/_availability_chart.html")
def availability_chart(rows, sites=None, caption="", chart_id="availability"):
    return {"chart": availability_layout(rows, sites), "caption": caption, "chart_id": chart_id}
