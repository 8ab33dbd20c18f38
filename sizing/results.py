"""HTTP glue shared by the calculator page and the JSON API.

Gets the live catalog through ``settings.SIZING_CANDIDATES_PROVIDER`` (sizing never
imports inventory), runs one estimate + recommendation, and shapes the answer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, gettext_noop

from . import SizingInputError, SizingRequest, parse_request, recommend
from .alternatives import Change, one_change_alternatives
from .engine import MAX_NODE_GPUS, Estimate
from .recommend import Candidate, Option, Recommendation, _run_json, _usd, overbuy_warning
from .texts import Texts, texts

#: every input the page and the API accept (query parameter names)
PARAMS = ("model", "params", "config", "method", "seq", "batch", "checkpointing",
          "flash_attention", "lora_rank", "lora_targets", "gpus", "zero", "offload",
          "tokens", "epochs", "utilisation", "framework", "loss", "vendor", "site", "in_stock")

#: each breakdown term's label (msgids; the pages translate them through sizing.texts)
BREAKDOWN_MSGIDS = {
    "frozen_weights": gettext_noop("Frozen base weights"),
    "trainable_weights": gettext_noop("Trainable weights"),
    "gradients": gettext_noop("Gradients"),
    "fp32_master": gettext_noop("fp32 master copy"),
    "optimizer_states": gettext_noop("Optimizer states"),
    "adapters": gettext_noop("LoRA adapters"),
    "sharding_buffers": gettext_noop("ZeRO-3 gather buffers"),
    "quant_buffers": gettext_noop("Dequantised 4-bit layer"),
    "activations": gettext_noop("Activations"),
    "logits": gettext_noop("Logits"),
    "cuda_context": gettext_noop("CUDA context"),
    "allocator_margin": gettext_noop("Allocator margin"),
}
BREAKDOWN_LABELS = {key: gettext_lazy(msgid) for key, msgid in BREAKDOWN_MSGIDS.items()}


class _Catalog:
    """The provider's last answer and what is derived from it once: the provider
    keeps its catalog for ``CATALOG_CACHE_SECONDS`` and answers with the same object until
    stock, prices or sites change (``inventory.selectors.cached_by_generation``), so the
    memo key (a repr of every candidate) and the site list are computed once per catalog,
    not once per request. A new object from the provider is a new catalog."""

    __slots__ = ("provided", "cands", "key", "sites")

    def __init__(self, provided):
        self.provided = provided  # held, so its id cannot be reused while we compare with it
        self.cands = list(provided)
        self.key: str | None = None
        self.sites: list[str] | None = None


_last = _Catalog(())


def candidates() -> list[Candidate]:
    """The whole live catalog (all sites); the recommender filters by site itself. The
    same list while the provider's catalog is unchanged: read it, never change it."""
    global _last
    provided = _provider(settings.SIZING_CANDIDATES_PROVIDER)()
    last = _last
    if provided is not last.provided:
        last = _last = _Catalog(provided)
    return last.cands


@functools.lru_cache(maxsize=8)
def _provider(path: str):
    """The provider at this dotted path (imported once per path, not once per request)."""
    return import_string(path)


def catalog_key(cands: list[Candidate]) -> str:
    """What memoised answers are keyed on: every candidate's prices, links and free units,
    so a stock or price change is a new key (one rule for the API and the pages)."""
    last = _last
    if cands is not last.cands:
        return repr(cands)
    if last.key is None:
        last.key = repr(cands)
    return last.key


def known_sites(cands: list[Candidate]) -> list[str]:
    last = _last
    if cands is not last.cands:
        return sorted({s for c in cands for s in c.free_by_site})
    if last.sites is None:
        last.sites = sorted({s for c in cands for s in c.free_by_site})
    return list(last.sites)


def clean_params(raw: Mapping) -> dict:
    """Known parameters only; blank values mean "use the default"."""
    out = {}
    for key in PARAMS:
        value = raw.get(key)
        if isinstance(value, str):
            value = value.strip()
        if value not in (None, ""):
            out[key] = value
    return out


#: what each checkpoint size holds, so no one reads an adapter's size as the model's (msgids;
#: the pages translate them through sizing.texts)
CHECKPOINT_MSGIDS = {
    "full": {
        "resume_with_optimizer": gettext_noop("Resume checkpoint: bf16 weights + fp32 master copy + "
                                              "optimizer states"),
        "bf16_weights": gettext_noop("Fine-tuned model, bf16 weights only (what you ship)"),
    },
    "adapter": {
        "resume_with_optimizer": gettext_noop("Resume checkpoint: adapter + its optimizer states "
                                              "(the frozen base is not saved)"),
        "adapter": gettext_noop("Adapter alone, fp32 (what you ship)"),
        "bf16_weights": gettext_noop("Adapter merged into the base, bf16 weights"),
    },
}
CHECKPOINT_LABELS = {kind: {key: gettext_lazy(msgid) for key, msgid in msgids.items()}
                     for kind, msgids in CHECKPOINT_MSGIDS.items()}


@dataclass(frozen=True)
class Result:
    request: SizingRequest
    recommendation: Recommendation
    changes: tuple[Change, ...] = ()

    @property
    def estimate(self):
        """The job as configured (the user's GPUs, ZeRO stage and offload)."""
        return self.recommendation.estimate

    @property
    def plan(self) -> Estimate:
        """The recommended plan's estimate (its cards, mode and ZeRO stage): the headline."""
        return self.best.estimate if self.best else self.estimate

    @property
    def plan_differs(self) -> bool:
        """The plan shards or spreads the job differently from how it was configured."""
        p, e = self.plan, self.estimate
        return (p.gpus, p.zero, p.offload) != (e.gpus, e.zero, e.offload)

    @property
    def checkpoints(self) -> list[tuple[str, float]]:
        """(label, GB) for each checkpoint size that applies to the method."""
        e = self.estimate
        labels = CHECKPOINT_LABELS["adapter" if e.adapter_params else "full"]
        return [(label, e.checkpoint_gb[key]) for key, label in labels.items()]

    @property
    def best(self) -> Option | None:
        return self.recommendation.best

    @property
    def options(self) -> tuple[Option, ...]:
        return self.recommendation.options

    @property
    def warnings(self) -> list[str]:
        return self.warnings_in(texts())

    def warnings_in(self, tr: Texts) -> list[str]:
        """``warnings``, with the language's texts table the caller already holds."""
        if not self.best:
            return list(self.estimate.warnings)
        overbuy = overbuy_warning(self.estimate, self.best.candidate, tr)  # goes in advice
        card = [w for w in self.best.warnings if w != overbuy]
        return _unique(list(self.estimate.warnings) + card)

    @property
    def advice(self) -> list[str]:
        """Cluster advice (nothing fits, or more than one node) and overbuy warnings."""
        return self.advice_in(texts())

    def advice_in(self, tr: Texts) -> list[str]:
        """``advice``, with the language's texts table the caller already holds."""
        out = [a for a in self.recommendation.advice if a not in self.estimate.warnings]
        if self.request.job.gpus > MAX_NODE_GPUS:
            out.append(_("More than 8 GPUs: nodes here have at most 8, so an on-demand "
                         "cluster provider fits better for a multi-node job."))
        for o in self.options:
            if w := overbuy_warning(self.estimate, o.candidate, tr):
                out.append(w)
        return _unique(out)

    def order_url(self, option: Option) -> str:
        return offer_order_url(option.candidate, self.request.site)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


@functools.lru_cache(maxsize=1024)
def offer_order_url(c: Candidate, site: str | None) -> str:
    """The order page of this offer at the requested site (else its best-stocked one).
    Kept per (offer, site): the candidate is the key, every price and free count in it,
    so a stock change is a new key and the old one ages out."""
    site = order_site(c, site)
    query = f"?{urlencode({'site': site})}" if site else ""
    return f"/order/{c.offer_slug}/{query}"


def order_site(c: Candidate, site: str | None) -> str | None:
    """The requested site, else the site with the most free units of this offer."""
    if site:
        return site
    stocked = [(n, s) for s, n in c.free_by_site.items() if n > 0]
    return max(stocked)[1] if stocked else None


def run(params: Mapping, cands: list[Candidate]) -> Result:
    """Validate and size; raises :class:`SizingInputError` naming the field."""
    req = parse_request(clean_params(params))
    sites = known_sites(cands)
    if req.site and req.site not in sites:
        raise SizingInputError("site", _("unknown site; choose one of %s")
                               % (", ".join(sites) or "—"))
    estimates: dict = {}  # each configuration sized once for the answer and its one-change plans
    rec = recommend(req.job, cands, vendor=req.vendor, site=req.site, in_stock=req.in_stock,
                    estimates=estimates)
    changes = one_change_alternatives(req.job, cands, vendor=req.vendor, site=req.site,
                                      in_stock=req.in_stock, best=rec.best, estimates=estimates)
    return Result(req, rec, tuple(changes))


def _r(x: float) -> float:
    return round(x, 2)


def _option_mid(o: Option) -> tuple[dict, dict]:
    """The keys of ``_option_json`` that depend on the job: (those between the offer's head
    and tail, those between its tail and its stock and link)."""
    e, run = o.estimate, o.run
    mid = {"offload": e.offload, "mode": o.mode, "zero": e.zero, "per_gpu_gb": round(e.per_gpu_gb, 2),
           "headroom_gb": round(o.headroom_gb, 2)}
    rest = {"reason": o.reason, "run_hours": None if o.run_hours is None else round(o.run_hours, 2),
            "rental_cost_usd": _usd(o.rental_cost_cents), "compute_cost_usd": _usd(o.compute_cost_cents),
            "warnings": list(o.warnings), "max_micro_batch": o.max_micro_batch, **_run_json(run)}
    return mid, rest


def _option_json(result: Result, o: Option) -> dict:
    """``o.to_dict(site)`` with the offer's free units per site and its order link; what
    it says of the offer whatever the input comes from ``_offer_json``."""
    head, tail, links = _offer_json(o.candidate, result.request.site)[:3]
    mid, rest = _option_mid(o)
    d = {**head, **mid, **tail, **rest}
    d["free_by_site"] = dict(links[0])
    d["order_url"] = links[1]
    return d


#: (offer, site) → what an offer's JSON says of it whatever the input (``_offer_json``);
#: kept by the offer's identity (the catalog's objects, which a price or stock change
#: replaces), checked on use, so a new offer at a reused id is never served the old one's
_OFFER_JSON: dict[tuple, tuple] = {}
_OFFER_JSON_MAX = 1024


def _offer_json(c: Candidate, site: str | None) -> tuple[dict, dict, tuple]:
    """(the keys of ``Option.to_dict`` before the layout's, those between it and the costs,
    (free units per site, order link)): the same values, built once per offer and site."""
    key = (id(c), site)
    hit = _OFFER_JSON.get(key)
    if hit is not None and hit[0] is c:
        return hit[1]
    head = {"offer": c.offer_slug, "offer_name": c.offer_name, "gpu": c.gpu_name, "vendor": c.vendor,
            "gpus": c.gpus, "vram_gb": c.vram_gb, "link": c.link, "host_ram_gb": c.host_ram_gb}
    tail = {"weekly_usd": _usd(c.weekly_cents), "monthly_usd": _usd(c.monthly_cents),
            "per_gpu_hour_usd": _usd(c.per_gpu_hour_cents), "total_tflops": c.total_tflops,
            "in_stock": c.free(site) > 0, "free": c.free(site)}
    links = (dict(c.free_by_site), offer_order_url(c, site))
    # the same three parts as JSON text, without their braces (``_option_text``)
    text = (_inner(head), _inner(tail), _inner({"free_by_site": links[0], "order_url": links[1]}))
    value = (head, tail, links, text)
    if len(_OFFER_JSON) >= _OFFER_JSON_MAX:
        _OFFER_JSON.clear()
    _OFFER_JSON[key] = (c, value)
    return value


try:
    from _json import make_encoder as _c_make_encoder
except ImportError:  # no C accelerator: json.dumps
    _c_make_encoder = None
#: ``json.dumps``' own C encoder, made once instead of on every call (an answer is written
#: in ~15 parts), without the circular-reference bookkeeping (an answer is a tree)
_ENCODE = None if _c_make_encoder is None else _c_make_encoder(
    None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)


def dumps(data) -> str:
    """``json.dumps(data, cls=DjangoJSONEncoder)``: the answer holds only JSON's own types, which
    the plain encoder writes alike and faster (a sixth of a cold answer's encoding went to the
    subclass); anything else (a lazy text, a Decimal) still goes through Django's."""
    try:
        return json.dumps(data) if _ENCODE is None else "".join(_ENCODE(data, 0))
    except TypeError:
        return json.dumps(data, cls=DjangoJSONEncoder)


def _inner(data: dict) -> str:
    """A non-empty dict's JSON without its braces: the members to splice into an object."""
    return dumps(data)[1:-1]


#: the types ``_json_r2`` writes in one call: floats only (an int, a bool or None is written
#: as ``dumps`` writes it)
_FLOATS = {float}
#: below this sum of sizes each float's "%.2f", less a last "0", is ``repr(round(x, 2))``
_PLAIN = 1e13


def _json_r2(values: list) -> list[str]:
    """``dumps(round(v, 2))`` of each value (None: "null"). An answer writes ~60 such figures,
    and round() then repr() each ran the float-to-decimal conversion twice: where every value
    is a float and their sizes sum below ``_PLAIN`` (so none is nan or inf), one "%" call
    writes them all, each with its last "0" dropped (tests/sizing/test_fast_paths.py)."""
    if {*map(type, values)} <= _FLOATS and sum(map(abs, values)) < _PLAIN:
        return (("%.2f\x01" * len(values)) % tuple(values)).replace("0\x01", "\x01").split("\x01")[:-1]
    return ["null" if v is None else dumps(round(v, 2)) for v in values]


def _cents_json(cents) -> float | None:
    """What ``_usd`` rounds: cents as dollars (None stays None)."""
    return None if cents is None else cents / 100


def _run_text(run) -> str:
    """``_inner(_run_json(run))``, its figures through ``_json_r2``."""
    if run is None:
        return _NO_RUN
    sp = run.speed
    (lo, hi), (clo, chi) = run.hours_range, run.rental_range_cents
    h_lo, h_hi, c_lo, c_hi = _json_r2([lo, hi, _cents_json(clo), _cents_json(chi)])
    return (f'"tokens_per_s": {_int_json(round(sp.tokens_per_s))}, '
            f'"tokens_per_s_per_gpu": {_int_json(round(sp.per_gpu))}, '
            f'"tokens_per_s_range": [{_int_json(round(sp.slow))}, {_int_json(round(sp.fast))}], '
            f'"run_hours_range": [{h_lo}, {h_hi}], "rental_cost_range_usd": [{c_lo}, {c_hi}]')


_NO_RUN = _inner(_run_json(None))


def _int_json(n) -> str:
    """An int as JSON writes it (round() of a float is an int; anything else goes to ``dumps``)."""
    return str(n) if type(n) is int else dumps(n)


def _option_text(result: Result, o: Option) -> str:
    """``dumps(_option_json(result, o))``, with the offer's parts written once per offer and
    site (``_offer_json``): most of an option's JSON says the same of the offer every time;
    the job's figures through ``_json_r2``."""
    head, tail, links = _offer_json(o.candidate, result.request.site)[3]
    e = o.estimate
    per_gpu, headroom, hours, rental, compute = _json_r2(
        [e.per_gpu_gb, o.headroom_gb, o.run_hours, _cents_json(o.rental_cost_cents),
         _cents_json(o.compute_cost_cents)])
    mid = _inner({"offload": e.offload, "mode": o.mode, "zero": e.zero})
    reason = _inner({"reason": o.reason})
    rest = _inner({"warnings": list(o.warnings), "max_micro_batch": o.max_micro_batch})
    return (f'{{{head}, {mid}, "per_gpu_gb": {per_gpu}, "headroom_gb": {headroom}, {tail}, {reason}, '
            f'"run_hours": {hours}, "rental_cost_usd": {rental}, "compute_cost_usd": {compute}, {rest}, '
            f'{_run_text(o.run)}, {links}}}')


def to_json_text(result: Result) -> str:
    """``dumps(to_json(result))``, byte for byte, from the options' texts (``_option_text``)
    and the figures through ``_json_r2``: what GET /api/v1/estimate answers
    (tests/sizing/test_fast_paths.py holds the two alike)."""
    e = result.estimate
    bd = e.breakdown_gb
    p = result.plan if result.best else None
    pbd = p.breakdown_gb if p is not None else {}
    figures = _json_r2([e.per_gpu_gb, e.total_gb, e.host_ram_gb, *bd.values(),
                        *((p.per_gpu_gb, p.total_gb, *pbd.values()) if p is not None else ())])
    k = 3 + len(bd)
    head = _inner({"model": e.model, "method": e.method, "params": e.params, "gpus": e.gpus, "zero": e.zero,
                   "offload": e.offload})
    tr = texts()
    tail = _inner({"checkpoint_gb": {key: round(v, 3) for key, v in e.checkpoint_gb.items()},
                   "adapter_params": e.adapter_params, "train_flops": e.train_flops, "framework": e.framework,
                   "warnings": result.warnings_in(tr)})
    plan = "null"
    if p is not None:
        o = result.best
        plan_head = _inner({"offer": o.candidate.offer_slug, "mode": o.mode, "gpus": p.gpus, "zero": p.zero,
                            "offload": p.offload})
        plan = (f'{{{plan_head}, "per_gpu_gb": {figures[k]}, "total_gb": {figures[k + 1]}, '
                f'"breakdown_gb": {_members(pbd, figures[k + 2:])}}}')
    recs = ", ".join(_option_text(result, o) for o in result.options)
    changes = ", ".join(f"{{{_inner(_change_head(ch))}, {_option_text(result, ch.option)[1:]}"
                        for ch in result.changes)
    return (f'{{{head}, "per_gpu_gb": {figures[0]}, "total_gb": {figures[1]}, "host_ram_gb": {figures[2]}, '
            f'"breakdown_gb": {_members(bd, figures[3:k])}, {tail}, "recommendations": [{recs}], '
            f'"advice": {dumps(result.advice_in(tr))}, "plan": {plan}, "one_change": [{changes}]}}')


#: a dict's keys → its JSON with a "%s" for each value (``_members``); the engine's breakdown
#: keys are the same dozen on every answer
_MEMBERS: dict[tuple, str] = {}


def _members(data: dict, texts: list[str]) -> str:
    """``dumps(data)`` where ``texts`` are its values' JSON, in order."""
    keys = tuple(data)
    template = _MEMBERS.get(keys)
    if template is None:
        if len(_MEMBERS) >= 64:  # the engine's keys: a handful of tuples; bounded all the same
            _MEMBERS.clear()
        template = _MEMBERS[keys] = "{" + ", ".join(f"{dumps(key).replace('%', '%%')}: %s" for key in keys) + "}"
    return template % tuple(texts)


def _plan_json(result: Result) -> dict | None:
    if not result.best:
        return None
    p, o = result.plan, result.best
    return {"offer": o.candidate.offer_slug, "mode": o.mode, "gpus": p.gpus, "zero": p.zero,
            "offload": p.offload, "per_gpu_gb": _r(p.per_gpu_gb), "total_gb": _r(p.total_gb),
            "breakdown_gb": {k: _r(v) for k, v in p.breakdown_gb.items()}}


def _change_head(ch: Change) -> dict:
    return {"change": ch.key, "label": str(ch.label), "tradeoff": str(ch.tradeoff), "query": ch.query}


def _change_json(result: Result, ch: Change) -> dict:
    return {**_change_head(ch), **_option_json(result, ch.option)}


def to_json(result: Result, *, options: bool = True) -> dict:
    """The answer; ``options=False``: without its recommendations and one-change plans
    (``to_json_text`` writes those from their texts)."""
    e = result.estimate
    recs = [_option_json(result, o) for o in result.options] if options else []
    out = {
        "model": e.model, "method": e.method, "params": e.params, "gpus": e.gpus,
        "zero": e.zero, "offload": e.offload,
        "per_gpu_gb": _r(e.per_gpu_gb), "total_gb": _r(e.total_gb),
        "host_ram_gb": _r(e.host_ram_gb),
        "breakdown_gb": {k: _r(v) for k, v in e.breakdown_gb.items()},
        "checkpoint_gb": {k: round(v, 3) for k, v in e.checkpoint_gb.items()},
        "adapter_params": e.adapter_params, "train_flops": e.train_flops,
        "framework": e.framework,
        "warnings": result.warnings, "recommendations": recs, "advice": result.advice,
        "plan": _plan_json(result),
    }
    if not options:
        del out["recommendations"]
        return out
    out["one_change"] = [_change_json(result, ch) for ch in result.changes]
    return out
