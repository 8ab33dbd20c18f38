"""The calculator's results (the htmx fragment, and the results column of the full page)
built in Python: what the removed template ``sizing/_results.html`` rendered, byte for
byte.

A cold fragment spent about half its CPU in the template engine: ~20 {% translate %} and
{% blocktranslate %} tags, each a gettext through a context-local and a lazy string, and
the {% if %}/{% with %} nodes resolving the same variables again. Here every text comes
from the language's texts table (``sizing.texts``: one lookup per process and language),
each value is escaped as ``{{ value }}`` escapes it (``sizing.markup._esc``), and the
blocktranslate msgids are the template's, so the zh_Hans catalogue still applies.
The layout is the template's, whitespace included: tests/sizing/test_golden.py and
``bench/calculator_compare.py`` (600 varied inputs, both languages) compare byte for byte.
"""

from __future__ import annotations

from django.template.defaultfilters import stringformat
from django.utils.safestring import SafeString
from django.utils.translation import gettext_noop

from .markup import _bt, _esc, _gb, _nbt, _t, usd_formatter
from .membar import memory_bar_parts
from .results import CHECKPOINT_MSGIDS
from .templatetags.sizing_tags import (
    METHOD_WORDS,
    _figure_text,
    _mode_word,
    billions,
    breakdown_rows,
    change_head,
    change_rows,
    pct,
    recommendation_head,
    recommendation_rows,
)
from .texts import Texts, texts


def results_html(form, result) -> str:
    """The results markup for this form (its errors; None: no errors) and result
    (None: no answer)."""
    return "".join(results_parts(form, result))


def results_bytes(form, result) -> bytes:
    """``results_html(form, result)`` in UTF-8, each part encoded alone: most parts are
    ASCII, which encodes as a copy, where the whole (not ASCII: "—", "≤", "×") took the
    per-character path for all its ~12 KB, and was first copied into a wider string."""
    return b"".join([part.encode() for part in results_parts(form, result)])


def results_parts(form, result) -> list[str]:
    tr = texts()
    errors = _errors(form, tr) if form is not None and form.errors else ""
    body = _result(result, tr) if result else []
    return [f'<div id="sizing-results-body" class="sizing-results-body">\n{errors}\n', *body, "\n</div>\n"]


class _Fixed:
    """The results' fixed texts in one language, escaped (a figure text: ``_figure_text``),
    looked up once and kept in its texts table: each answer looked them up through
    ``tr[gettext_noop(…)]`` and ``_t`` again."""

    def __init__(self, tr: Texts):
        self.per_gpu_best = _t(tr[gettext_noop("Per GPU, recommended plan")])
        self.per_gpu = _t(tr[gettext_noop("Per GPU")])
        self.host = _t(tr[gettext_noop("Host RAM")])
        self.params = _figure_text(tr, gettext_noop("%(b)s B parameters"), "b")
        self.bar = _t(tr[gettext_noop("Where the memory goes")])
        self.recs = _t(tr[gettext_noop("Recommendation, cheapest first")])
        self.no_recs = _t(tr[gettext_noop("No offer in the catalog runs this job with these filters.")])
        self.changes = _t(tr[gettext_noop("Cheaper by changing one choice")])
        self.time = _t(tr[gettext_noop("Training time and cost")])
        self.flops = _figure_text(tr, gettext_noop("6·N·D = %(f)s FLOPs."), "f")
        self.assumes = _figure_text(tr, gettext_noop("Assumes %(u)s of the card's dense bf16 FLOPS (utilisation)."),
                                    "u")
        self.checkpoints = _t(tr[gettext_noop("Checkpoints on disk")])
        self.checkpoint_labels = {kind: [(key, _t(tr[msgid])) for key, msgid in msgids.items()]
                                  for kind, msgids in CHECKPOINT_MSGIDS.items()}
        self.numbers_best = _t(tr[gettext_noop("The numbers, per GPU, on the recommended plan")])
        self.numbers = _t(tr[gettext_noop("The numbers, per GPU, as you configured it")])
        self.warnings = _t(tr[gettext_noop("Warnings")])
        self.advice = _t(tr[gettext_noop("Advice")])


def _fixed(tr: Texts) -> _Fixed:
    try:
        return tr.extra["fragment-fixed"]
    except KeyError:
        value = tr.extra["fragment-fixed"] = _Fixed(tr)
        return value


def _errors(form, tr: Texts) -> str:
    fields = "".join(f"<li><strong>{_esc(field.label)}</strong> ({_esc(field.name)}): {_esc(e)}</li>"
                     for field in form for e in field.errors)
    others = "".join(f"<li>{_esc(e)}</li>" for e in form.non_field_errors())
    heading = _t(tr[gettext_noop("Please fix these inputs:")])
    return (f'\n  <div class="msg error" role="alert"><p>{heading}</p>\n    <ul>{fields}\n    {others}</ul>\n'
            f'  </div>\n')


def _method_word(code: str, tr: Texts) -> str:
    """``sizing_method``, through the texts table (``METHOD_WORDS``' msgids)."""
    return tr.pgettext("sizing method", code) if code in METHOD_WORDS else code


def _framework_label(job, tr: Texts) -> str:
    """The training stack's (lazily translated) label, in the language of ``tr``."""
    key = ("framework", job.framework)
    try:
        return tr.extra[key]
    except KeyError:
        value = tr.extra[key] = str(job.stack.label)
        return value


def _summary(result, tr: Texts) -> str:
    e, p, best, job = result.estimate, result.plan, result.best, result.request.job
    title = _bt(tr, gettext_noop("%(model)s, %(method)s"), model=e.model, method=_method_word(e.method, tr))
    fx = _fixed(tr)
    params = fx.params % {"b": billions(e.params)}
    per_gpu = fx.per_gpu_best if best else fx.per_gpu
    total = _nbt(tr, tr.ngettext("Total, %(n)s GPU", "Total, %(n)s GPUs", p.gpus), p.gpus)
    host = fx.host
    plan = ""
    if best:
        plan_text = _bt(tr, gettext_noop("Plan: %(offer)s, %(mode)s (ZeRO-%(z)s)."),
                        offer=best.candidate.offer_name, mode=_mode_word(best.mode, tr), z=p.zero)
        configured = ""
        if result.plan_differs:
            configured = _nbt(tr, tr.ngettext(
                "As you configured it (%(n)s GPU, ZeRO-%(z)s) the job needs %(gb)s GB per GPU.",
                "As you configured it (%(n)s GPUs, ZeRO-%(z)s) the job needs %(gb)s GB per GPU.", e.gpus),
                e.gpus, gb=_gb(e.per_gpu_gb), z=e.zero)
        plan = f'<p class="sizing-plan">{plan_text}\n    {configured}</p>'
    stack = _bt(tr, gettext_noop("Memory terms of: %(fw)s."), fw=_framework_label(job, tr))
    return (f'\n<section class="sizing-summary" aria-labelledby="need-h">\n  <h2 id="need-h">{title}\n'
            f'    <small class="muted">{params}</small></h2>\n  <dl class="sizing-figures">\n'
            f'    <div><dt>{per_gpu}</dt><dd class="big">{_gb(p.per_gpu_gb)} <small>GB</small></dd></div>\n'
            f'    <div><dt>{total}</dt><dd class="big">{_gb(p.total_gb)} <small>GB</small></dd></div>\n'
            f'    <div><dt>{host}</dt><dd class="big">{_gb(p.host_ram_gb)} <small>GB</small></dd></div>\n'
            f'  </dl>\n  {plan}\n  <p class="muted">{stack}</p>\n</section>\n')


def _bar(result, tr: Texts) -> list[str]:
    best = result.best
    head = f'\n<section aria-labelledby="bar-h">\n  <h3 id="bar-h">{_fixed(tr).bar}</h3>\n  \n    '
    if best:
        caption = SafeString(_bt(
            tr, gettext_noop("Per GPU on the recommended %(offer)s (%(mode)s). The dashed line is the usable "
                             "memory: a card is never filled to its last GB."),
            offer=best.candidate.offer_name, mode=_mode_word(best.mode, tr)))
        bar = memory_bar_parts(best.estimate, best.candidate, caption, tr=tr)
        head += "\n    "
    else:
        bar = memory_bar_parts(result.estimate, None, "", tr=tr)
    return [head, *bar, "\n  \n</section>\n"]


def _list_section(ident: str, heading: str, items: list, ul: str, li: str) -> str:
    entries = "".join(f"{li}{_esc(item)}</li>" for item in items)
    return (f'<section aria-labelledby="{ident}"><h3 id="{ident}">{heading}</h3>\n'
            f'  {ul}{entries}</ul></section>')


def _recommendations(result, tr: Texts) -> str:
    fx = _fixed(tr)
    heading = fx.recs
    if result.options:
        table = (f'\n  <div class="table-scroll"><table class="catalog sizing-recs">\n'
                 f'    {recommendation_head(result.request.job.tokens, tr=tr)}\n'
                 f'    <tbody>{recommendation_rows(result, tr=tr)}\n    </tbody></table></div>\n  ')
    else:
        table = f'\n    <p class="empty">{fx.no_recs}</p>\n  '
    return f'\n<section aria-labelledby="rec-h">\n  <h3 id="rec-h">{heading}</h3>\n  {table}\n</section>\n'


def _changes(result, tr: Texts) -> str:
    if not result.changes:
        return ""
    heading = _fixed(tr).changes
    return (f'<section aria-labelledby="change-h">\n  <h3 id="change-h">{heading}</h3>\n'
            f'  <div class="table-scroll"><table class="catalog sizing-changes">\n    {change_head(tr=tr)}\n'
            f'    <tbody>{change_rows(result, tr=tr)}</tbody></table></div>\n</section>')


def _training_time(result, tr: Texts) -> str:
    e, best, job = result.estimate, result.best, result.request.job
    if not job.tokens:
        return ""
    fx = _fixed(tr)
    heading = fx.time
    flops = fx.flops % {"f": stringformat(e.train_flops, ".3g")}
    run = ""
    if best:
        usd = usd_formatter(tr=tr)
        run = _bt(tr, gettext_noop("About %(h)s hours on the %(offer)s: the rental is %(cost)s (whole weeks or "
                                   "months); the compute itself is worth %(compute)s at the per-GPU-hour rate."),
                  h=_gb(best.run_hours), offer=best.candidate.offer_name, cost=usd(best.rental_cost_cents),
                  compute=usd(best.compute_cost_cents))
        if best.run is not None:
            (lo, hi), (clo, chi) = best.run.hours_range, best.run.rental_range_cents
            run += "\n  " + _bt(
                tr, gettext_noop("At %(tps)s tokens/s; likely between %(lo)s and %(hi)s hours, a rental of %(clo)s "
                                 "to %(chi)s: how busy a step keeps the card differs between stacks."),
                tps=f"{round(best.run.speed.tokens_per_s):,}", lo=_gb(lo), hi=_gb(hi), clo=usd(clo), chi=usd(chi))
    assumes = fx.assumes % {"u": pct(job.utilisation)}
    return (f'<section aria-labelledby="time-h"><h3 id="time-h">{heading}</h3>\n  <p>{flops}\n  {run}\n'
            f'  <small class="muted">{assumes}</small></p>\n</section>')


def _checkpoints(result, tr: Texts) -> str:
    fx = _fixed(tr)
    heading = fx.checkpoints
    e = result.estimate  # Result.checkpoints, with the labels through the texts table
    labels = fx.checkpoint_labels["adapter" if e.adapter_params else "full"]
    items = "".join([f"\n    <li>{label}: <strong>{_gb(e.checkpoint_gb[key], 2)} GB</strong></li>"
                     for key, label in labels])
    return (f'<section aria-labelledby="ckpt-h"><h3 id="ckpt-h">{heading}</h3>\n'
            f'  <ul class="sizing-ckpt">{items}\n  </ul>\n</section>\n')


def _breakdown(result, tr: Texts) -> str:
    fx = _fixed(tr)
    summary = fx.numbers_best if result.best else fx.numbers
    return (f'<details class="sizing-breakdown"><summary>{summary}</summary>\n'
            f'  <table><tbody>{breakdown_rows(result.plan.breakdown_gb, tr=tr)}</tbody></table>\n</details>\n')


def _result(result, tr: Texts) -> list[str]:
    warnings, advice = result.warnings_in(tr), result.advice_in(tr)
    fx = _fixed(tr)
    warn = _list_section("warn-h", fx.warnings, warnings, '<ul class="sizing-warnings">',
                         '<li class="msg warning">') if warnings else ""
    adv = _list_section("adv-h", fx.advice, advice, "<ul>", "<li>") if advice else ""
    # in parts (``results_bytes``), each encoded alone: the bar's, the training time's, the
    # checkpoints' and the breakdown's are ASCII in English, the tables' rows are not ("≤", "–")
    return [_summary(result, tr), *_bar(result, tr), f"\n{warn}\n", _recommendations(result, tr), "\n",
            _changes(result, tr), f"\n\n{_training_time(result, tr)}\n\n{adv}\n\n", _checkpoints(result, tr), "\n",
            _breakdown(result, tr)]
