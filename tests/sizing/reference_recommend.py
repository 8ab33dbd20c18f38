"""The recommender as it was before its layouts were judged on sizes alone (``_Estimator.sizes``)
and its offers' prices worked out in one pass (``recommend._prices``): the reference that
tests/sizing/test_fast_paths.py holds ``recommend``, ``cheapest`` and the one-change plans to.
Kept as it was (its own layouts, estimates and costing); the dataclasses are the module's."""
# ruff: noqa

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.utils.translation import gettext, gettext_noop

from sizing import pools
from sizing.alternatives import Change, _texts
from sizing.engine import ALLOCATOR_MARGIN, MAX_NODE_GPUS, Estimate, Job
from sizing.estimation import estimate, layout_free_terms, with_warnings
from sizing.inputs import MAX_BATCH
from sizing.job_warnings import job_warnings
# the headroom and link rules did not change: the reference uses the engine's own
from sizing.layouts import can_data_parallel, can_shard, host_ram_short, usable_gb, usable_host_gb
# the time and cost of a run did not change either
from sizing.recommend import Candidate, Option, Recommendation, _price, finish_on, run_cost
from sizing.texts import Texts, texts
from sizing.throughput import Finish

LINKS = ("nvswitch", "infinity_fabric", "nvlink_bridge", "pcie_p2p", "pcie")
#: overbuy: the job uses less than this share of the offer's memory
OVERBUY_FRACTION = 0.25
HOURS_PER_MONTH = 720
HOURS_PER_WEEK = 168
MAX_ALTERNATIVES = 4


def link_warning(candidate: Candidate, zero: int, gpus: int, tr: Texts | None = None) -> str | None:
    """Warn when a requested sharded configuration does not suit the offer's link. ``tr``:
    the active language's texts table (``sizing.texts``; looked up when not given)."""
    n = min(gpus, candidate.gpus)
    if zero >= 2 and n > 1 and not can_shard(candidate.link, n):
        return ((tr or texts())[gettext_noop("ZeRO-%(zero)s shards the model, which needs NVLink/NVSwitch; "
                                             "%(gpu)s (%(link)s) only supports data-parallel or single-card "
                                             "training.")]
                % {"zero": zero, "gpu": candidate.gpu_name, "link": candidate.link})
    return None


def overbuy_warning(est: Estimate, candidate: Candidate, tr: Texts | None = None) -> str | None:
    """The job needs less than 25% of the offer's memory (SPEC "Don't overbuy")."""
    if est.per_gpu_gb * est.gpus < OVERBUY_FRACTION * candidate.total_vram_gb:
        return ((tr or texts())[gettext_noop(
            "Overbuy: this job needs %(need)s GB and %(offer)s has %(vram)s GB, over four times as much. Pick "
            "the card by what the job needs, not by the model you wish to train: the cheapest card that fits "
            "is slower, but not by the price ratio.")]
                % {"need": f"{est.per_gpu_gb * est.gpus:.0f}", "offer": candidate.offer_name,
                   "vram": candidate.total_vram_gb})
    return None


def fewer_cards_warning(opt: Option, est: _Estimator, pool: Iterable[Candidate] = ()) -> str | None:
    """A sharded plan that would fit on half the offer's cards or fewer buys idle GPUs; said
    only when an offer with that many of the card exists (advice about offers that do)."""
    c = opt.candidate
    if opt.mode != "zero-3" or c.gpus < 4:
        return None
    usable = usable_gb(c.vram_gb)
    smaller = sorted((o for o in pool if o.gpu_name == c.gpu_name and 2 <= o.gpus <= c.gpus // 2
                      and can_shard(o.link, o.gpus)), key=lambda o: (o.gpus, o.monthly_cents))
    for other in smaller:
        if (need := est(other.gpus, 3).per_gpu_gb) <= usable_gb(other.vram_gb) and need <= usable:
            return (est.tr[gettext_noop("Overbuy: ZeRO-3 fits this job on %(offer)s (%(need)s GB per card); "
                                        "this offer has %(gpus)s cards. Fewer cards, or one of the one-change "
                                        "plans, cost less.")]
                    % {"offer": other.offer_name, "need": f"{need:.1f}", "gpus": c.gpus})
    return None


def _usd(cents: float | None) -> float | None:
    """USD cents → dollars rounded to the cent (None stays None)."""
    return None if cents is None else round(cents / 100, 2)


def _run_json(run: Finish | None) -> dict:
    """Throughput and the time and cost to finish, each with its range (null without tokens)."""
    if run is None:
        return {"tokens_per_s": None, "tokens_per_s_per_gpu": None, "tokens_per_s_range": None,
                "run_hours_range": None, "rental_cost_range_usd": None}
    sp = run.speed
    return {"tokens_per_s": round(sp.tokens_per_s), "tokens_per_s_per_gpu": round(sp.per_gpu),
            "tokens_per_s_range": [round(sp.slow), round(sp.fast)],
            "run_hours_range": [round(run.hours_range[0], 2), round(run.hours_range[1], 2)],
            "rental_cost_range_usd": [_usd(run.rental_range_cents[0]), _usd(run.rental_range_cents[1])]}


class _Estimator:
    """Memoises :func:`estimate` per (gpus, zero, offload, method) of one job. ``shared``: a
    dict kept across the ``recommend`` calls of one answer, for jobs that differ at most in
    their method (``sizing.alternatives``' variants), so that each configuration is sized
    once per answer, not once per variant. The estimates carry no job warnings:
    those are the job's as configured (``recommend``'s ``own``)."""

    def __init__(self, job: Job, shared: dict | None = None):
        self.job = job
        #: estimates by (gpus, zero, offload, method); ("terms", method): layout_free_terms,
        #: which the variants share; ("layout", …): ``_layout``s, which the ROCm variant shares
        self.cache: dict[tuple, Any] = {} if shared is None else shared

    @functools.cached_property
    def tr(self) -> Texts:
        """The reasons and warnings, in the active language (looked up when first needed:
        most one-change plans are never costed)."""
        return texts()

    def __call__(self, gpus: int, zero: int, offload: str = "none", method: str | None = None):
        key = (gpus, zero, offload, method or self.job.method)
        cache = self.cache
        value = cache.get(key)  # misses are common: no KeyError raised for them
        if value is None:
            method, job = key[3], self.job
            terms = cache.get(("terms", method))
            if terms is None:  # no layout changes them: the job itself serves for its own method
                terms = cache["terms", method] = layout_free_terms(
                    job if method == job.method else job.laid_out(gpus, zero, offload, method))
            # sized in the layout without a copy of the job per layout (estimate's ``layout``)
            value = cache[key] = estimate(job, warnings=False, terms=terms, layout=key)
        return value


def _configure(c: Candidate, est: _Estimator) -> Option:
    """DP/single when the job fits one card; else ZeRO-3 if the link may shard. Either
    fits only when what it moves to host RAM fits the instance too."""
    return Option(c, *_layout(c, est))


def _layout(c: Candidate, est: _Estimator) -> tuple[Estimate, str, bool]:
    """``_configure``'s (estimate, mode, fits), without building the option: the ranking
    configures many offers and keeps few. Kept in the estimator's cache (one answer's)."""
    key = ("layout", id(c), est.job.method, est.job.offload)  # the offers outlive the answer
    value = est.cache.get(key)  # most are misses: no KeyError raised for them
    if value is None:
        value = est.cache[key] = _lay_out(c, est)
    return value


def _lay_out(c: Candidate, est: _Estimator) -> tuple[Estimate, str, bool]:
    gpus = c.gpus
    usable = usable_gb(c.vram_gb)
    whole = est(gpus, 0)
    mode = "single" if gpus == 1 else "data-parallel"
    if whole.per_gpu_gb <= usable and can_data_parallel(c.link, gpus) and not host_ram_short(c, whole):
        return whole, mode, True
    if can_shard(c.link, gpus):
        sharded = est(gpus, 3, est.job.offload)
        return sharded, "zero-3", sharded.per_gpu_gb <= usable and not host_ram_short(c, sharded)
    return whole, mode, False


def _host_ram_advice(options: Iterable[Option]) -> str | None:
    """When an offer would hold the job in VRAM but its instance's RAM cannot hold what
    the plan moves to the host, say so (the largest such instance), rather than only that
    nothing fits."""
    short = [o for o in options if not o.fits and host_ram_short(o.candidate, o.estimate)
             and o.estimate.per_gpu_gb <= usable_gb(o.candidate.vram_gb)]
    if not short:
        return None
    o = max(short, key=lambda o: (o.candidate.host_ram_gb, -o.candidate.monthly_cents))
    return (gettext("%(offer)s holds this job in GPU memory, but the plan moves %(need)s GB to host "
                    "memory and its instance has %(ram)s GB (%(usable)s GB usable): offload less, or "
                    "choose an offer with more host memory.")
            % {"offer": o.candidate.offer_name, "need": f"{o.estimate.host_ram_gb:.0f}",
               "ram": o.candidate.host_ram_gb, "usable": f"{usable_host_gb(o.candidate.host_ram_gb):.0f}"})


def _card_warnings(opt: Option, est: _Estimator, own: Estimate, pool: Iterable[Candidate] = ()) -> tuple[str, ...]:
    w = []
    c, job = opt.candidate, est.job
    if job.method == "qlora":
        bf16 = est(opt.estimate.gpus, opt.estimate.zero, opt.estimate.offload, "lora")
        if bf16.per_gpu_gb <= usable_gb(c.vram_gb):
            w.append(est.tr[gettext_noop("bf16 LoRA (%(gb)s GB) fits this card: 4-bit costs 20–40%% throughput "
                                         "(dequantisation); don't use QLoRA when the memory is there.")]
                     % {"gb": f"{bf16.per_gpu_gb:.0f}"})
    lw = link_warning(c, job.zero, job.gpus, est.tr)
    if lw:
        w.append(lw)
    for overbuy in (overbuy_warning(own, c, est.tr), fewer_cards_warning(opt, est, pool)):
        if overbuy:
            w.append(overbuy)
    return tuple(w)


def max_micro_batch(opt: Option, est: _Estimator) -> int:
    """The largest micro-batch this configuration fits in the card's usable memory (0: not
    even the job's own). Every per-GPU term grows linearly with the micro-batch (activations,
    logits, the 4-bit input copies, and the allocator margin over them), so the estimate's
    own terms give the line; capped at the calculator's largest micro-batch."""
    e, job = opt.estimate, est.job
    usable = usable_gb(opt.candidate.vram_gb)
    if e.per_gpu_gb > usable:
        return 0
    # what grows with the micro-batch (activations, the 4-bit input copies in them, logits),
    # per sample, with the allocator's margin over it; nothing else does
    slope = (1 + ALLOCATOR_MARGIN) * (e.breakdown_gb["activations"] + e.breakdown_gb["logits"]) / job.batch
    if slope <= 0:
        return MAX_BATCH
    return min(job.batch + math.floor((usable - e.per_gpu_gb) / slope * (1 - 1e-12)), MAX_BATCH)


def _with_costs(opt: Option, job: Job, reason: str, est: _Estimator, own: Estimate,
                pool: Iterable[Candidate] = ()) -> Option:
    c = opt.candidate
    if opt.mode == "zero-3":
        reason = est.tr[gettext_noop("%(reason)s · ZeRO-3 across %(n)s cards: each holds 1/%(n)s of the states, "
                                     "about 1.5× the traffic of data-parallel")] % {"reason": reason, "n": c.gpus}
    run = finish_on(opt, job)
    hours, rental, compute = (run.hours, run.rental_cents, run.compute_cents) if run else (None, None, None)
    # the constructor, not dataclasses.replace: the same option, without replace's per-field work
    return Option(c, opt.estimate, opt.mode, opt.fits, reason=reason, run_hours=hours, rental_cost_cents=rental,
                  compute_cost_cents=compute, warnings=_card_warnings(opt, est, own, pool), run=run,
                  max_micro_batch=max_micro_batch(opt, est))


def _pick_alternatives(fitting: list[Candidate], limit: int, tr: Texts) -> list[tuple[int, str]]:
    """Next cheapest, then each pricier offer faster or roomier than all cheaper ones: (its
    index in ``fitting``, the reason), so only the picked become options."""
    best, rest = fitting[0], fitting[1:]
    picked = [(1, tr[gettext_noop("next cheapest")])] if rest and limit > 0 else []
    top_tflops = max([best.total_tflops] + [fitting[i].total_tflops for i, _ in picked])
    top_mem = max([best.total_vram_gb] + [fitting[i].total_vram_gb for i, _ in picked])
    for i, c in enumerate(rest[1:], start=2):
        if len(picked) >= limit:
            break
        if c.total_tflops > top_tflops:
            picked.append((i, tr[gettext_noop("faster")]))
        elif c.total_vram_gb > top_mem:
            picked.append((i, tr[gettext_noop("more headroom")]))
        top_tflops, top_mem = max(top_tflops, c.total_tflops), max(top_mem, c.total_vram_gb)
    return picked


def _cluster_advice(est: _Estimator, pool: Sequence[Candidate]) -> str:
    """No offer fits: how many of the largest card would, with ZeRO-3?"""
    if not pool:
        return gettext("No offer matches the filters.")
    big = max(pool, key=lambda c: (c.vram_gb, c.bf16_tflops))
    usable = usable_gb(big.vram_gb)
    for n in (2, 4, 8, 16, 32, 64):
        if est(n, 3).per_gpu_gb <= usable:
            break
    else:
        n = 0
    if n and n <= MAX_NODE_GPUS:
        largest = max(c.gpus for c in pool if c.gpu_name == big.gpu_name)
        return (gettext("No offer here runs this job: with ZeRO-3 it needs %(n)s× %(gpu)s or more, and the "
                        "largest %(gpu)s offer has %(largest)s.")
                % {"n": n, "gpu": big.gpu_name, "largest": largest})
    need = f"{n}× {big.gpu_name}" if n else gettext("more than 64× %(gpu)s") % {"gpu": big.gpu_name}
    return (gettext("This job needs %(need)s with ZeRO-3: more than one 8-GPU node. Nodes here have at "
                    "most 8 GPUs; an on-demand cluster provider fits better.") % {"need": need})


def _why_best(job: Job, tr: Texts) -> str:
    return tr[gettext_noop("cheapest run")] if job.tokens > 0 else tr[gettext_noop("cheapest that fits")]


def recommend(job: Job, candidates: Iterable[Candidate], *, vendor: str = "cuda",
              site: str | None = None, in_stock: bool = False,
              max_alternatives: int = MAX_ALTERNATIVES, estimates: dict | None = None) -> Recommendation:
    """Cheapest fitting offer first, then alternatives. Cheapest by monthly price (then
    faster); when the job gives its tokens (a run-time estimate), by what renting it for the
    whole run costs, so a faster card that finishes in fewer weeks can win.
    ``estimates``: shared by calls for jobs that differ only in their method (``_Estimator``)."""
    est = _Estimator(job, estimates)
    own = with_warnings(est(job.gpus, job.zero, job.offload), tuple(job_warnings(job)))
    pool, by_month = pools.pool(candidates, vendor, site, in_stock)
    layouts = [(c, _layout(c, est)) for c in pool]
    # (candidate, estimate, mode) of each offer that fits, cheapest first (without tokens, in
    # the filter's kept monthly order); an Option is built only for the shown ones
    if job.tokens > 0:
        fitting = sorted(((c, e, mode) for c, (e, mode, fits) in layouts if fits),
                         key=lambda f: _price(f[0], f[1].offload, job))
    else:
        fitting = [(c, e, mode) for c, (e, mode, fits) in (layouts[i] for i in by_month) if fits]
    advice = list(own.warnings)
    if not fitting:
        host = _host_ram_advice(Option(c, *layout) for c, layout in layouts)
        advice.append(host if host else _cluster_advice(est, pool))
        return Recommendation(own, None, (), tuple(advice), site)
    best = _with_costs(Option(*fitting[0], True), job, _why_best(job, est.tr), est, own, pool)
    alts = tuple(_with_costs(Option(*fitting[i], True), job, why, est, own, pool)
                 for i, why in _pick_alternatives([f[0] for f in fitting], max_alternatives, est.tr))
    return Recommendation(own, best, alts, tuple(advice), site)


def cheapest(job: Job, candidates: Iterable[Candidate], *, vendor: str = "cuda", site: str | None = None,
             in_stock: bool = False, estimates: dict | None = None,
             accept: Callable[[Candidate], bool] | None = None) -> Option | None:
    """``recommend(...).best``, without what only the whole recommendation needs (the job's
    own warnings, the alternatives, the cluster advice): what the one-change plans show.
    A card's price does not depend on how the job is laid out on it (the run's
    FLOPs are the same in every configuration), so the offers are ranked first and
    configured cheapest first until one fits, in the order ``recommend``'s stable sort
    of the fitting ones gives. ``accept``: a test of that offer; when it fails, None,
    without working out the option's costs and warnings (a one-change plan that would
    not be shown), and without configuring the offers after the last one it passes:
    whichever of them fits first would fail it."""
    est = _Estimator(job, estimates)
    pool, by_month = pools.pool(candidates, vendor, site, in_stock)
    # priced in the job's own configuration (its offload): est(job.gpus, job.zero, job.offload)
    ranked = sorted(pool, key=lambda c: _price(c, job.offload, job)) if job.tokens > 0 else [
        pool[i] for i in by_month]
    if accept is not None:
        ranked = ranked[:1 + max((i for i, c in enumerate(ranked) if accept(c)), default=-1)]
    for c in ranked:
        e, mode, fits = _layout(c, est)
        if fits:
            if accept is not None and not accept(c):
                return None
            own = est(job.gpus, job.zero, job.offload)
            return _with_costs(Option(c, e, mode, True), job, _why_best(job, est.tr), est, own, pool)
    return None


def _variants(job: Job, vendor: str) -> list[tuple[str, dict, Job, str]]:
    """(key, changed parameters, changed job, vendor) for every change that applies."""
    out = []
    if vendor == "cuda":
        out.append(("vendor", {"vendor": "any"}, job, "any"))
    if job.method == "lora":
        out.append(("qlora", {"method": "qlora"}, job.laid_out(job.gpus, job.zero, job.offload, "qlora"), vendor))
    if job.method == "full":
        out.append(("optimizer-8bit", {"method": "full-8bit"}, job.laid_out(job.gpus, job.zero, job.offload, "full-8bit"), vendor))
    if job.method in ("full", "full-8bit"):
        out.append(("lora", {"method": "lora"}, job.laid_out(job.gpus, job.zero, job.offload, "lora"), vendor))
        if job.offload == "none":
            # ZeRO-3 with the master weights and moments in host RAM: only the offers whose
            # instance holds them fit (recommend.host_ram_short)
            out.append(("offload", {"zero": "3", "offload": "optimizer"},
                        job.laid_out(job.gpus, 3, "optimizer", job.method), vendor))
    return out


def one_change_alternatives(job: Job, candidates: list[Candidate], *, vendor: str,
                            site: str | None, in_stock: bool, best: Option | None,
                            estimates: dict | None = None) -> list[Change]:
    """Cheapest first; only changes that beat the recommended plan's monthly price.
    ``estimates``: the job's recommendation's (``recommend(..., estimates=)``): every variant
    changes only the method or the vendor, so the configurations it sizes are shared."""
    limit = best.candidate.monthly_cents if best else None
    estimates = {} if estimates is None else estimates
    out = []
    for key, query, changed, v in _variants(job, vendor):
        def shown(c: Candidate, key: str = key) -> bool:
            if limit is not None and c.monthly_cents >= limit:
                return False
            # the cheapest is still a CUDA card: allowing ROCm changes nothing
            return not (key == "vendor" and c.vendor == "nvidia")

        option = cheapest(changed, candidates, vendor=v, site=site, in_stock=in_stock, estimates=estimates,
                          accept=shown)
        if option is None:
            continue
        label, tradeoff = _texts(key)
        out.append(Change(key, label, tradeoff, option, query))
    return sorted(out, key=lambda ch: (ch.option.candidate.monthly_cents, ch.key))


# --- sizing.estimation.layout_free_terms as it was: one engine term function per term --------

from sizing.engine import (  # noqa: E402
    ADAM_STATE_BYTES,
    active_params,
    activation_bytes,
    adapter_params,
    checkpoint_gb,
    checkpoint_input_bytes,
    frozen_weight_bytes,
    logits_bytes,
    quant_buffer_bytes,
    sharding_buffer_bytes,
    train_flops,
)
from sizing.estimation import _state_totals  # noqa: E402


def layout_free_terms(job: Job) -> dict:  # sizing.estimation's before its terms were read once
    """The terms no layout of the job changes — activations, logits, the 4-bit buffers, the
    checkpoints on disk, the FLOPs: they depend on the model, the method and the tokens,
    not on the GPU count, ZeRO stage or offload. The recommender sizes one job in several
    layouts (one per card count it meets) and computes these once."""
    n_adapter = 0 if job.method in ADAM_STATE_BYTES else adapter_params(job.arch, job.lora_rank, job.lora_targets)
    return {
        "frozen_weights": frozen_weight_bytes(job.arch, job.method, job.stack.upcast_unquantised),
        # the model states before a layout shards or offloads them, and ZeRO-3's buffers
        "state_slots": _state_totals(job, n_adapter),
        "zero3_buffers": sharding_buffer_bytes(job, (2, 3, job.offload, job.method)),
        "quant_buffers": quant_buffer_bytes(job), "activations": activation_bytes(job),
        "logits": logits_bytes(job.arch, job.seq, job.batch, job.loss_kind),
        "host_checkpoint_inputs": checkpoint_input_bytes(job) if job.checkpointing and job.stack.offloads_checkpoints
        else None,
        "adapter_params": n_adapter, "checkpoint_gb": checkpoint_gb(job, n_adapter),
        "train_flops": train_flops(active_params(job.arch), job.tokens, job.epochs),
    }
