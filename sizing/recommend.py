"""Recommendation: the cheapest offer that runs the job, and a few alternatives.

Pure Python, no Django: the inventory app turns its offers into :class:`Candidate` rows.

Rules (SPEC "Card-to-card links"):

* single-card LoRA/QLoRA (or anything that fits one card) runs on any card with the memory;
* data-parallel (every card holds the whole job) tolerates PCIe peer-to-peer;
* anything that shards the model (ZeRO-2/3, tensor parallel) needs NVLink/fabric: NVSwitch
  up to 8 cards, an NVLink bridge pairs only, Infinity Fabric 8-way only; more than four
  cards need NVSwitch (or the 8-way fabric);
* RTX 4090/5090 (``pcie``): single card only.

Headroom: a card is never filled to its last GB. Usable memory =
``VRAM − max(2 GB, 5% of VRAM)`` (``usable_gb``): 24 GB → 22, 48 → 45.6, 80 → 76, 141 →
133.95, 192 → 182.4. This reproduces the first document's choices: a 79 GB job does not go
on an 80 GB card, 51 GB does; 33 GB fits 48 GB; 21 GB and 10 GB fit 24 GB.

Host memory: what a plan moves to host RAM (offloaded optimizer states or parameters,
Unsloth's offloaded checkpoints) must fit the instance's RAM less its own headroom
(``usable_host_gb``: the OS, the data loaders and the page cache need some); an offer whose
instance cannot hold it does not fit, however much VRAM it has. An offer whose RAM is not
known (no node of its model yet) is judged on VRAM alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from django.utils.translation import gettext

from . import pools
from .engine import ALLOCATOR_MARGIN, MAX_NODE_GPUS, Estimate, Job
from .estimation import with_warnings
from .frozen import quick_init
from .inputs import MAX_BATCH  # at import: a local import per costed offer showed in the profile
from .job_warnings import job_warnings
from .layouts import (  # noqa: F401 - the recommender's rules, read from here by callers and tests
    HEADROOM_FRACTION,
    HEADROOM_MIN_GB,
    HOST_HEADROOM_FRACTION,
    HOST_HEADROOM_MIN_GB,
    Estimator,
    can_data_parallel,
    can_shard,
    host_ram_short,
    layout_on,
    layouts_of,
    offer_facts,
    usable_gb,
    usable_host_gb,
)
from .layouts import prices as price_list
from .texts import Texts, texts
from .throughput import Finish, finish, rental_to_finish

#: one job's estimates, kept for one answer (``sizing.layouts``)
_Estimator = Estimator

def gettext_noop(message: str) -> str:
    """Marks a text for makemessages (which finds it by this name), as Django's does, without
    reading Django's settings: the texts below are marked at import, and sizing is imported
    where settings are not configured (bench/load.py reads the presets)."""
    return message


#: the recommender's texts (msgids: each answer translates them through its texts table,
#: ``sizing.texts``), marked once here rather than by a call on every answer
_CHEAPEST_RUN = gettext_noop("cheapest run")
_CHEAPEST_FITS = gettext_noop("cheapest that fits")
_NEXT_CHEAPEST = gettext_noop("next cheapest")
_FASTER = gettext_noop("faster")
_MORE_HEADROOM = gettext_noop("more headroom")
_ZERO3_REASON = gettext_noop("%(reason)s · ZeRO-3 across %(n)s cards: each holds 1/%(n)s of the states, "
    "about 1.5× the traffic of data-parallel")
_BF16_FITS = gettext_noop("bf16 LoRA (%(gb)s GB) fits this card: 4-bit costs 20–40%% throughput "
    "(dequantisation); don't use QLoRA when the memory is there.")
_OVERBUY = gettext_noop(
    "Overbuy: this job needs %(need)s GB and %(offer)s has %(vram)s GB, over four times as much. Pick "
    "the card by what the job needs, not by the model you wish to train: the cheapest card that fits "
    "is slower, but not by the price ratio.")
_FEWER_CARDS = gettext_noop("Overbuy: ZeRO-3 fits this job on %(offer)s (%(need)s GB per card); "
    "this offer has %(gpus)s cards. Fewer cards, or one of the one-change "
    "plans, cost less.")
_LINK_CANNOT_SHARD = gettext_noop("ZeRO-%(zero)s shards the model, which needs NVLink/NVSwitch; "
    "%(gpu)s (%(link)s) only supports data-parallel or single-card "
    "training.")

LINKS = ("nvswitch", "infinity_fabric", "nvlink_bridge", "pcie_p2p", "pcie")
#: overbuy: the job uses less than this share of the offer's memory
OVERBUY_FRACTION = 0.25
HOURS_PER_MONTH = 720
HOURS_PER_WEEK = 168
MAX_ALTERNATIVES = 4


@dataclass(frozen=True, slots=True)
class Candidate:
    """One rentable offer (prices in USD cents, VRAM per GPU in GB, TFLOPS per GPU)."""

    offer_slug: str
    offer_name: str
    gpu_name: str
    vendor: str  # 'nvidia' | 'amd'
    gpus: int
    vram_gb: int
    link: str  # one of LINKS
    weekly_cents: int
    monthly_cents: int
    bf16_tflops: float
    free_by_site: Mapping[str, int] = field(default_factory=dict, hash=False)
    #: the instance's host RAM in GB (None: not known, no node of the model yet)
    host_ram_gb: int | None = None

    @property
    def per_gpu_hour_cents(self) -> int:
        """SPEC: per GPU-hour = monthly price / 720 / GPUs, to the cent (comparison only)."""
        return round(self.monthly_cents / HOURS_PER_MONTH / self.gpus)

    @property
    def total_tflops(self) -> float:
        return self.bf16_tflops * self.gpus

    @property
    def total_vram_gb(self) -> int:
        return self.vram_gb * self.gpus

    def free(self, site: str | None = None) -> int:
        if site is not None:
            return self.free_by_site.get(site, 0)
        return sum(self.free_by_site.values())


def link_warning(candidate: Candidate, zero: int, gpus: int, tr: Texts | None = None) -> str | None:
    """Warn when a requested sharded configuration does not suit the offer's link. ``tr``:
    the active language's texts table (``sizing.texts``; looked up when not given)."""
    n = min(gpus, candidate.gpus)
    if zero >= 2 and n > 1 and not can_shard(candidate.link, n):
        return ((tr or texts())[_LINK_CANNOT_SHARD]
                % {"zero": zero, "gpu": candidate.gpu_name, "link": candidate.link})
    return None


def overbuy_warning(est: Estimate, candidate: Candidate, tr: Texts | None = None) -> str | None:
    """The job needs less than 25% of the offer's memory (SPEC "Don't overbuy")."""
    return _overbuy(est.per_gpu_gb * est.gpus, candidate, tr)


def _overbuy(need_gb: float, candidate: Candidate, tr: Texts | None) -> str | None:
    """``overbuy_warning`` of a job that needs ``need_gb`` on all its cards."""
    if need_gb < OVERBUY_FRACTION * candidate.total_vram_gb:
        return ((tr or texts())[_OVERBUY]
                % {"need": f"{need_gb:.0f}", "offer": candidate.offer_name,
                   "vram": candidate.total_vram_gb})
    return None


def fewer_cards_warning(opt: Option, est: _Estimator, pool: Iterable[Candidate] = ()) -> str | None:
    """A sharded plan that would fit on half the offer's cards or fewer buys idle GPUs; said
    only when an offer with that many of the card exists (advice about offers that do)."""
    return _fewer_cards(opt.candidate, opt.mode, est, pool)


def _fewer_cards(c: Candidate, mode: str, est: _Estimator, pool: Iterable[Candidate]) -> str | None:
    if mode != "zero-3" or c.gpus < 4:
        return None
    usable = usable_gb(c.vram_gb)
    smaller = sorted((o for o in pool if o.gpu_name == c.gpu_name and 2 <= o.gpus <= c.gpus // 2
                      and can_shard(o.link, o.gpus)), key=lambda o: (o.gpus, o.monthly_cents))
    for other in smaller:
        if (need := est.sizes(other.gpus, 3)[0]) <= usable_gb(other.vram_gb) and need <= usable:
            return (est.tr[_FEWER_CARDS]
                    % {"offer": other.offer_name, "need": f"{need:.1f}", "gpus": c.gpus})
    return None


def _usd(cents: float | None) -> float | None:
    """USD cents → dollars rounded to the cent (None stays None)."""
    return None if cents is None else round(cents / 100, 2)


@quick_init  # built by the dozen per answer (sizing.frozen)
@dataclass(frozen=True, slots=True)
class Option:
    """A candidate evaluated for the job, in the configuration the recommender chose."""

    candidate: Candidate
    estimate: Estimate
    mode: str  # 'single' | 'data-parallel' | 'zero-3'
    fits: bool
    reason: str = ""
    run_hours: float | None = None
    rental_cost_cents: int | None = None
    compute_cost_cents: int | None = None
    warnings: tuple[str, ...] = ()
    run: Finish | None = None  # time and cost to finish, with their range (sizing.throughput)
    max_micro_batch: int | None = None  # the largest micro-batch this configuration fits

    @property
    def headroom_gb(self) -> float:
        return self.candidate.vram_gb - self.estimate.per_gpu_gb

    def to_dict(self, site: str | None = None) -> dict:
        c = self.candidate
        return {
            "offer": c.offer_slug, "offer_name": c.offer_name, "gpu": c.gpu_name,
            "vendor": c.vendor, "gpus": c.gpus, "vram_gb": c.vram_gb, "link": c.link,
            "host_ram_gb": c.host_ram_gb, "offload": self.estimate.offload,
            "mode": self.mode, "zero": self.estimate.zero,
            "per_gpu_gb": round(self.estimate.per_gpu_gb, 2),
            "headroom_gb": round(self.headroom_gb, 2),
            "weekly_usd": _usd(c.weekly_cents), "monthly_usd": _usd(c.monthly_cents),
            "per_gpu_hour_usd": _usd(c.per_gpu_hour_cents),
            "total_tflops": c.total_tflops, "in_stock": c.free(site) > 0,
            "free": c.free(site), "reason": self.reason,
            "run_hours": None if self.run_hours is None else round(self.run_hours, 2),
            "rental_cost_usd": _usd(self.rental_cost_cents),
            "compute_cost_usd": _usd(self.compute_cost_cents),
            "warnings": list(self.warnings),
            "max_micro_batch": self.max_micro_batch,
            **_run_json(self.run),
        }


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


@dataclass(frozen=True, slots=True)
class Recommendation:
    """Cheapest fitting option (``best``), alternatives, and advice for the customer."""

    estimate: Estimate
    best: Option | None
    alternatives: tuple[Option, ...]
    advice: tuple[str, ...]
    site: str | None = None

    @property
    def options(self) -> tuple[Option, ...]:
        return ((self.best,) if self.best else ()) + self.alternatives

    def to_dict(self) -> dict:
        return {"recommendations": [o.to_dict(self.site) for o in self.options],
                "advice": list(self.advice)}


def _configure(c: Candidate, est: _Estimator) -> Option:
    """DP/single when the job fits one card; else ZeRO-3 if the link may shard. Either
    fits only when what it moves to host RAM fits the instance too."""
    return Option(c, *_layout(c, est))


def _layout(c: Candidate, est: _Estimator) -> tuple[Estimate, str, bool]:
    """``_configure``'s (estimate, mode, fits), without building the option."""
    key, mode, fits = layout_on(c, est)
    return est(*key), mode, fits


def _host_ram_advice(pool: Sequence[Candidate], layouts: list, est: _Estimator) -> str | None:
    """When an offer would hold the job in VRAM but its instance's RAM cannot hold what
    the plan moves to the host, say so (the largest such instance), rather than only that
    nothing fits. ``layouts``: ``layout_on``'s verdicts of the pool's offers (none fits)."""
    short = []
    for c, (key, _, fits) in zip(pool, layouts, strict=True):
        per_gpu, host = est.sizes(*key[:3])
        if not fits and c.host_ram_gb is not None and host > usable_host_gb(c.host_ram_gb) \
                and per_gpu <= usable_gb(c.vram_gb):
            short.append((c, host))
    if not short:
        return None
    c, host = max(short, key=lambda s: (s[0].host_ram_gb, -s[0].monthly_cents))
    return (gettext("%(offer)s holds this job in GPU memory, but the plan moves %(need)s GB to host "
                    "memory and its instance has %(ram)s GB (%(usable)s GB usable): offload less, or "
                    "choose an offer with more host memory.")
            % {"offer": c.offer_name, "need": f"{host:.0f}",
               "ram": c.host_ram_gb, "usable": f"{usable_host_gb(c.host_ram_gb):.0f}"})


def _card_warnings(c: Candidate, e: Estimate, mode: str, est: _Estimator, own_need_gb: float,
                   pool: Iterable[Candidate] = ()) -> tuple[str, ...]:
    """The warnings of the job on ``c`` in the layout ``e`` (``mode``); ``own_need_gb``: what
    the job as configured needs on all its cards (the overbuy test)."""
    w = []
    job = est.job
    if job.method == "qlora":
        bf16 = est.sizes_as("lora", e.gpus, e.zero, e.offload)[0]
        if bf16 <= usable_gb(c.vram_gb):
            w.append(est.tr[_BF16_FITS]
                     % {"gb": f"{bf16:.0f}"})
    if job.zero >= 2:
        lw = link_warning(c, job.zero, job.gpus, est.tr)
        if lw:
            w.append(lw)
    overbuy = _overbuy(own_need_gb, c, est.tr)
    if overbuy:
        w.append(overbuy)
    if mode == "zero-3":
        fewer = _fewer_cards(c, mode, est, pool)
        if fewer:
            w.append(fewer)
    return tuple(w)


def finish_on(opt: Option, job: Job) -> Finish | None:
    """Time and cost to finish the job on this option (``sizing.throughput``), when the job
    gives its tokens and the card its TFLOPS; in the option's configuration (its offload)."""
    c = opt.candidate
    if job.tokens <= 0:
        return None
    return finish(job, c.bf16_tflops, c.gpus, c.weekly_cents, c.monthly_cents, opt.estimate.offload)


def run_cost(opt: Option, job: Job) -> tuple[float, int, int] | None:
    """(hours, cents to rent it long enough, its compute share) of the job on this option,
    when the job gives its tokens; the rent is whole weeks or whole months, whichever is less."""
    run = finish_on(opt, job)
    return None if run is None else (run.hours, run.rental_cents, run.compute_cents)


def max_micro_batch(opt: Option, est: _Estimator) -> int:
    """The largest micro-batch this configuration fits in the card's usable memory (0: not
    even the job's own). Every per-GPU term grows linearly with the micro-batch (activations,
    logits, the 4-bit input copies, and the allocator margin over them), so the estimate's
    own terms give the line; capped at the calculator's largest micro-batch."""
    return _max_micro_batch(opt.candidate, opt.estimate, est.job)


def _max_micro_batch(c: Candidate, e: Estimate, job: Job) -> int:
    usable = usable_gb(c.vram_gb)
    if e.per_gpu_gb > usable:
        return 0
    # what grows with the micro-batch (activations, the 4-bit input copies in them, logits),
    # per sample, with the allocator's margin over it; nothing else does
    slope = (1 + ALLOCATOR_MARGIN) * (e.breakdown_gb["activations"] + e.breakdown_gb["logits"]) / job.batch
    if slope <= 0:
        return MAX_BATCH
    return min(job.batch + math.floor((usable - e.per_gpu_gb) / slope * (1 - 1e-12)), MAX_BATCH)


def _with_costs(c: Candidate, e: Estimate, mode: str, job: Job, reason: str, est: _Estimator, own_need_gb: float,
                pool: Iterable[Candidate] = ()) -> Option:
    """The fitting option of the job on ``c`` in the layout ``e`` (``mode``), with its
    reason, run time and cost, card warnings and largest micro-batch."""
    if mode == "zero-3":
        reason = est.tr[_ZERO3_REASON] % {"reason": reason, "n": c.gpus}
    run = finish(job, c.bf16_tflops, c.gpus, c.weekly_cents, c.monthly_cents, e.offload) if job.tokens > 0 else None
    if run is None:
        return Option(c, e, mode, True, reason, None, None, None, _card_warnings(c, e, mode, est, own_need_gb, pool),
                      None, _max_micro_batch(c, e, job))
    return Option(c, e, mode, True, reason, run.hours, run.rental_cents, run.compute_cents,
                  _card_warnings(c, e, mode, est, own_need_gb, pool), run, _max_micro_batch(c, e, job))


def _pick_alternatives(fitting: list[Candidate], limit: int, tr: Texts) -> list[tuple[int, str]]:
    """Next cheapest, then each pricier offer faster or roomier than all cheaper ones: (its
    index in ``fitting``, the reason), so only the picked become options."""
    best, rest = fitting[0], fitting[1:]
    picked = [(1, tr[_NEXT_CHEAPEST])] if rest and limit > 0 else []
    top_tflops = max([best.total_tflops] + [fitting[i].total_tflops for i, _ in picked])
    top_mem = max([best.total_vram_gb] + [fitting[i].total_vram_gb for i, _ in picked])
    for i, c in enumerate(rest[1:], start=2):
        if len(picked) >= limit:
            break
        if c.total_tflops > top_tflops:
            picked.append((i, tr[_FASTER]))
        elif c.total_vram_gb > top_mem:
            picked.append((i, tr[_MORE_HEADROOM]))
        top_tflops, top_mem = max(top_tflops, c.total_tflops), max(top_mem, c.total_vram_gb)
    return picked


def _cluster_advice(est: _Estimator, pool: Sequence[Candidate]) -> str:
    """No offer fits: how many of the largest card would, with ZeRO-3?"""
    if not pool:
        return gettext("No offer matches the filters.")
    big = max(pool, key=lambda c: (c.vram_gb, c.bf16_tflops))
    usable = usable_gb(big.vram_gb)
    for n in (2, 4, 8, 16, 32, 64):
        if est.sizes(n, 3)[0] <= usable:
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


def _price(c: Candidate, offload: str, job: Job) -> tuple:
    """What offers are ranked by: the rental to finish the job (``offload``: the plan's) when
    it gives its tokens, else the monthly price; then the monthly price, then the faster."""
    rental = None
    if job.tokens > 0:
        rental = rental_to_finish(job, c.bf16_tflops, c.gpus, c.weekly_cents, c.monthly_cents, offload)
    return (c.monthly_cents if rental is None else rental, c.monthly_cents, -c.total_tflops)


def _why_best(job: Job, tr: Texts) -> str:
    return tr[_CHEAPEST_RUN] if job.tokens > 0 else tr[_CHEAPEST_FITS]


def recommend(job: Job, candidates: Iterable[Candidate], *, vendor: str = "cuda",
              site: str | None = None, in_stock: bool = False,
              max_alternatives: int = MAX_ALTERNATIVES, estimates: dict | None = None) -> Recommendation:
    """Cheapest fitting offer first, then alternatives. Cheapest by monthly price (then
    faster); when the job gives its tokens (a run-time estimate), by what renting it for the
    whole run costs, so a faster card that finishes in fewer weeks can win.
    ``estimates``: shared by calls for jobs that differ only in their method (``_Estimator``)."""
    est = _Estimator(job, estimates)
    own = with_warnings(est(job.gpus, job.zero, job.offload), tuple(job_warnings(job, est.tr)))
    pool, by_month = pools.pool(candidates, vendor, site, in_stock)
    layouts = layouts_of(pool, est)
    # (candidate, estimate's key, mode) of each offer that fits, cheapest first (without
    # tokens, in the filter's kept monthly order); an estimate and an Option are built only
    # for the shown ones
    if job.tokens > 0:
        prices: dict[str, list] = {}  # by the plan's offload: priced in it
        fitting_at = [i for i, (key, mode, fits) in enumerate(layouts) if fits]
        for i in fitting_at:
            offload = layouts[i][0][2]
            if offload not in prices:
                prices[offload] = price_list(pool, job, offload)
        fitting_at.sort(key=lambda i: prices[layouts[i][0][2]][i])
    else:
        fitting_at = [i for i in by_month if layouts[i][2]]
    advice = list(own.warnings)
    if not fitting_at:
        host = _host_ram_advice(pool, layouts, est)
        advice.append(host if host else _cluster_advice(est, pool))
        return Recommendation(own, None, (), tuple(advice), site)
    fitting = [pool[i] for i in fitting_at]
    own_need_gb = own.per_gpu_gb * own.gpus

    def costed(n: int, reason: str) -> Option:
        i = fitting_at[n]
        key, mode, _ = layouts[i]
        return _with_costs(pool[i], est(*key), mode, job, reason, est, own_need_gb, pool)

    best = costed(0, _why_best(job, est.tr))
    alts = tuple(costed(n, why) for n, why in _pick_alternatives(fitting, max_alternatives, est.tr))
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
    not be shown)."""
    pool, by_month = pools.pool(candidates, vendor, site, in_stock)
    accepted: set[int] = set()
    if accept is not None:
        # an offer the test refuses cannot be shown: with none accepted, nothing is priced or judged
        accepted = {i for i, c in enumerate(pool) if accept(c)}
        if not accepted:
            return None
    est = _Estimator(job, estimates)
    # priced in the job's own configuration (its offload): est(job.gpus, job.zero, job.offload)
    if job.tokens > 0:
        keys = price_list(pool, job, job.offload)
        ranked: Sequence[int] = sorted(range(len(pool)), key=keys.__getitem__)
    else:
        ranked = by_month
    if accept is not None:
        # the first fitting offer decides, and one past the last accepted cannot be shown: the
        # offers after it are not judged (most plans beat nothing; none is judged then)
        last = max(n for n, i in enumerate(ranked) if i in accepted)
        ranked = ranked[:last + 1]
    for i in ranked:
        c = pool[i]
        key, mode, fits = est.verdicts.get(id(c)) or layout_on(c, est)
        if fits:
            if accept is not None and i not in accepted:
                return None
            # the job as configured needs (overbuy test), without building its estimate
            own_need_gb = est.sizes(job.gpus, job.zero, job.offload)[0] * job.gpus
            return _with_costs(c, est(*key), mode, job, _why_best(job, est.tr), est, own_need_gb, pool)
    return None
