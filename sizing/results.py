"""HTTP glue shared by the calculator page and the JSON API.

Gets the live catalog through ``settings.SIZING_CANDIDATES_PROVIDER`` (sizing never
imports inventory), runs one estimate + recommendation, and shapes the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from django.conf import settings
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from . import SizingInputError, SizingRequest, parse_request, recommend
from .engine import MAX_NODE_GPUS
from .recommend import Candidate, Option, Recommendation, overbuy_warning

#: every input the page and the API accept (query parameter names)
PARAMS = ("model", "params", "config", "method", "seq", "batch", "checkpointing",
          "flash_attention", "lora_rank", "lora_targets", "gpus", "zero", "offload",
          "tokens", "epochs", "utilisation", "loss", "vendor", "site", "in_stock")

BREAKDOWN_LABELS = {
    "frozen_weights": gettext_lazy("Frozen base weights"),
    "trainable_weights": gettext_lazy("Trainable weights"),
    "gradients": gettext_lazy("Gradients"),
    "fp32_master": gettext_lazy("fp32 master copy"),
    "optimizer_states": gettext_lazy("Optimizer states"),
    "adapters": gettext_lazy("LoRA adapters"),
    "sharding_buffers": gettext_lazy("ZeRO-3 gather buffers"),
    "activations": gettext_lazy("Activations"),
    "logits": gettext_lazy("Logits"),
    "cuda_context": gettext_lazy("CUDA context"),
    "allocator_margin": gettext_lazy("Allocator margin"),
}


def candidates() -> list[Candidate]:
    """The whole live catalog (all sites); the recommender filters by site itself."""
    return list(import_string(settings.SIZING_CANDIDATES_PROVIDER)())


def known_sites(cands: list[Candidate]) -> list[str]:
    return sorted({s for c in cands for s in c.free_by_site})


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


@dataclass(frozen=True)
class Result:
    request: SizingRequest
    recommendation: Recommendation

    @property
    def estimate(self):
        return self.recommendation.estimate

    @property
    def best(self) -> Option | None:
        return self.recommendation.best

    @property
    def options(self) -> tuple[Option, ...]:
        return self.recommendation.options

    @property
    def warnings(self) -> list[str]:
        if not self.best:
            return list(self.estimate.warnings)
        overbuy = overbuy_warning(self.estimate, self.best.candidate)  # goes in advice
        card = [w for w in self.best.warnings if w != overbuy]
        return _unique(list(self.estimate.warnings) + card)

    @property
    def advice(self) -> list[str]:
        """Cluster advice (nothing fits, or more than one node) and overbuy warnings."""
        out = [a for a in self.recommendation.advice if a not in self.estimate.warnings]
        if self.request.job.gpus > MAX_NODE_GPUS:
            out.append(_("More than 8 GPUs: nodes here have at most 8, so an on-demand "
                         "cluster provider fits better for a multi-node job."))
        for o in self.options:
            if w := overbuy_warning(self.estimate, o.candidate):
                out.append(w)
        return _unique(out)

    def order_url(self, option: Option) -> str:
        site = order_site(option.candidate, self.request.site)
        query = f"?{urlencode({'site': site})}" if site else ""
        return f"/order/{option.candidate.offer_slug}/{query}"


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


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
    rec = recommend(req.job, cands, vendor=req.vendor, site=req.site, in_stock=req.in_stock)
    return Result(req, rec)


def _r(x: float) -> float:
    return round(x, 2)


def to_json(result: Result) -> dict:
    e = result.estimate
    recs = []
    for o in result.options:
        d = o.to_dict(result.request.site)
        d["free_by_site"] = dict(o.candidate.free_by_site)
        d["order_url"] = result.order_url(o)
        recs.append(d)
    return {
        "model": e.model, "method": e.method, "params": e.params, "gpus": e.gpus,
        "zero": e.zero, "offload": e.offload,
        "per_gpu_gb": _r(e.per_gpu_gb), "total_gb": _r(e.total_gb),
        "host_ram_gb": _r(e.host_ram_gb),
        "breakdown_gb": {k: _r(v) for k, v in e.breakdown_gb.items()},
        "checkpoint_gb": {k: round(v, 3) for k, v in e.checkpoint_gb.items()},
        "adapter_params": e.adapter_params, "train_flops": e.train_flops,
        "warnings": result.warnings, "recommendations": recs, "advice": result.advice,
    }
