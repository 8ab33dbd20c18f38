"""Template helpers for the sizing pages: the server-rendered SVG memory bar."""

from django import template
from django.utils.translation import pgettext_lazy

from ..recommend import usable_gb
from ..results import BREAKDOWN_LABELS

register = template.Library()

BAR_WIDTH = 640
#: issue 29: the phone drawing, whose 11-unit labels stay 11 px or more in a 320 px column
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


@register.inclusion_tag("sizing/_bar.html")
def memory_bar(estimate, card=None, caption=""):
    """``{% memory_bar option.estimate option.candidate %}``: per-GPU breakdown vs a card."""
    card_gb = card.vram_gb if card is not None else None
    drawings = [bar_geometry(estimate.breakdown_gb, estimate.per_gpu_gb, card_gb, width)
                for width in (BAR_WIDTH, NARROW_BAR_WIDTH)]
    return {"g": drawings[0], "drawings": drawings, "card": card, "caption": caption}


@register.filter
def gb(value, digits=1):
    """12.345 → '12.3'; None → '—'."""
    if value is None:
        return "—"
    return f"{value:,.{int(digits)}f}"


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
#: keeps the codes (they are the API's values), Chinese gets words (issue 29).
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
