"""Judging one job's layout on each offer: the sizes a layout needs, per card count, and
what an offer's fit reads of it (pure Python, no Django).

The recommender (``sizing.recommend``) and its one-change plans look at every offer of
the pool for each variant of the job, and show a few. Deciding whether an offer fits reads
only the per-GPU and host-memory figures of the job in the offer's layout, which depend on
its card count, ZeRO stage and offload, not on the offer: ``Estimator.sizes`` works them
out once per layout from the layout-free terms, without building the estimate; an
``Estimate`` is built only for the offers shown. What judging reads of an offer is kept
per offer (``offer_facts``, by identity), and the pool's prices for a job with tokens are
worked out in one pass (``prices``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .engine import MAX_NODE_GPUS, Estimate, Job
from .estimation import estimate, layout_free_terms, layout_sizes
from .texts import Texts, texts
from .throughput import HOURS_PER_MONTH, HOURS_PER_WEEK, _factors, flops_per_token

#: ``sizing.recommend.Candidate`` (named loosely, as in ``sizing.pools``: no import circle)
Candidate = Any

HEADROOM_MIN_GB = 2.0
HEADROOM_FRACTION = 0.05
#: host RAM kept for the OS, data loaders and page cache: max(8 GB, 10 % of the instance's)
HOST_HEADROOM_MIN_GB = 8.0
HOST_HEADROOM_FRACTION = 0.10


def usable_gb(vram_gb: float) -> float:
    """Headroom rule: VRAM − max(2 GB, 5% of VRAM)."""
    return vram_gb - max(HEADROOM_MIN_GB, HEADROOM_FRACTION * vram_gb)


def usable_host_gb(ram_gb: float) -> float:
    """Host RAM a plan may fill: RAM − max(8 GB, 10 % of RAM)."""
    return ram_gb - max(HOST_HEADROOM_MIN_GB, HOST_HEADROOM_FRACTION * ram_gb)


def host_ram_short(c: Candidate, e: Estimate) -> bool:
    """Does this plan move more to host RAM than the offer's instance can hold?"""
    return c.host_ram_gb is not None and e.host_ram_gb > usable_host_gb(c.host_ram_gb)


def can_shard(link: str, gpus: int) -> bool:
    """May the model be sharded (ZeRO-2/3, tensor parallel) over ``gpus`` cards on ``link``?"""
    if gpus < 2:
        return False
    if link == "nvswitch":
        return gpus <= MAX_NODE_GPUS
    if link == "infinity_fabric":
        return gpus == MAX_NODE_GPUS
    if link == "nvlink_bridge":
        return gpus == 2
    return False


def can_data_parallel(link: str, gpus: int) -> bool:
    """Data-parallel tolerates PCIe peer-to-peer; ``pcie`` (no P2P) cards are single-card."""
    return gpus == 1 or link != "pcie"


class Estimator:
    """Memoises :func:`estimate` per (gpus, zero, offload, method) of one job, and the sizes
    alone (``sizes``: what deciding whether a layout fits reads) per (gpus, zero, offload)
    and method. ``shared``: a dict kept across the ``recommend`` calls of one answer, for
    jobs that differ at most in their method (``sizing.alternatives``' variants), so that
    each configuration is sized once per answer, not once per variant. The estimates carry
    no job warnings: those are the job's as configured (``recommend``'s ``own``)."""

    def __init__(self, job: Job, shared: dict | None = None):
        self.job = job
        #: estimates by (gpus, zero, offload, method); ("terms", method): layout_free_terms,
        #: which the variants share; method and (method, offload): the tables below
        self.cache: dict[Any, Any] = {} if shared is None else shared
        self.method = job.method
        # the tables, two entries per method and (method, offload): an answer makes an
        # estimator per one-change plan, so its set-up is a couple of look-ups
        by_method = _tables(self.cache, job.method)
        by_offload = _tables(self.cache, (job.method, job.offload))
        #: (gpus, zero, offload) → (per-GPU GB, host GB), without the estimate
        self.table: dict[tuple, tuple[float, float]] = by_method[0]
        #: by card count, (per-GPU GB, host GB, the estimate's key) of the two layouts an
        #: offer is judged in: whole on each card (ZeRO-0), and ZeRO-3 with the job's offload
        self.whole: dict[int, tuple] = by_method[1]
        self.sharded: dict[int, tuple] = by_offload[1]
        #: ``layout_on``'s verdict per offer (by id: the answer's offers outlive it), shared by
        #: the jobs of the answer with this method and offload (the ROCm variant's is the job)
        self.verdicts: dict[int, tuple[tuple[int, int, str, str], str, bool]] = by_offload[0]

    @property
    def tr(self) -> Texts:
        """The reasons and warnings, in the active language (looked up when first needed:
        most one-change plans are never costed); one look-up per answer, kept in the shared
        cache (a plain property: ``cached_property`` takes a lock on every first use)."""
        tr = self.cache.get("texts")
        if tr is None:
            tr = self.cache["texts"] = texts()
        return tr

    def terms(self, method: str) -> dict:
        """``layout_free_terms`` of the job with this method (no layout changes them)."""
        terms = self.cache.get(("terms", method))
        if terms is None:  # the job itself serves for its own method
            job = self.job
            terms = self.cache["terms", method] = layout_free_terms(
                job if method == job.method else job.laid_out(job.gpus, job.zero, job.offload, method))
        return terms

    def __call__(self, gpus: int, zero: int, offload: str = "none", method: str | None = None) -> Estimate:
        key = (gpus, zero, offload, method or self.method)
        cache = self.cache
        value = cache.get(key)  # misses are common: no KeyError raised for them
        if value is None:
            # sized in the layout without a copy of the job per layout (estimate's ``layout``)
            value = cache[key] = estimate(self.job, warnings=False, terms=self.terms(key[3]), layout=key)
        return value

    def sizes(self, gpus: int, zero: int, offload: str = "none") -> tuple[float, float]:
        """(per_gpu_gb, host_ram_gb) of ``self(gpus, zero, offload)``, the same floats,
        without building the estimate: most layouts are only judged, never shown."""
        key = (gpus, zero, offload)
        value = self.table.get(key)
        if value is None:
            terms = self.cache.get(("terms", self.method)) or self.terms(self.method)
            value = self.table[key] = layout_sizes(terms, gpus, zero, offload)
        return value

    def sized(self, gpus: int, zero: int) -> tuple[float, float, tuple[int, int, str, str]]:
        """``whole`` (``zero`` 0) or ``sharded`` (3) of this card count, filled in."""
        offload = "none" if zero == 0 else self.job.offload
        sizes = self.table.get((gpus, zero, offload)) or self.sizes(gpus, zero, offload)
        value = (sizes[0], sizes[1], (gpus, zero, offload, self.method))
        (self.whole if zero == 0 else self.sharded)[gpus] = value
        return value

    def sizes_as(self, method: str, gpus: int, zero: int, offload: str) -> tuple[float, float]:
        """``sizes`` of the job with another method (a card's advice compares it)."""
        if method == self.method:
            return self.sizes(gpus, zero, offload)
        table = _tables(self.cache, method)[0]
        key = (gpus, zero, offload)
        value = table.get(key)
        if value is None:
            value = table[key] = layout_sizes(self.terms(method), gpus, zero, offload)
        return value


def _tables(cache: dict, key) -> tuple[dict, dict]:
    """The answer's two tables kept under ``key`` (a method, or a method and offload) in
    ``Estimator``'s shared cache, made empty on first use."""
    tables = cache.get(key)
    if tables is None:
        tables = cache[key] = ({}, {})
    return tables


#: an offer's facts that no job changes: (the offer, its GPUs, usable GB per card, may it
#: run data-parallel, may it shard, the host GB a plan may fill or None when not known)
Facts = tuple[Candidate, int, float, bool, bool, "float | None"]
_facts: dict[int, Facts] = {}
_FACTS_KEPT = 4096


def offer_facts(c: Candidate) -> Facts:
    """What judging a layout on this offer reads of it, kept per offer (by identity: a
    changed offer is a new object, so never an old offer's facts)."""
    facts = _facts.get(id(c))
    if facts is None or facts[0] is not c:
        if len(_facts) >= _FACTS_KEPT:
            _facts.clear()
        facts = _facts[id(c)] = (c, c.gpus, usable_gb(c.vram_gb), can_data_parallel(c.link, c.gpus),
                                 can_shard(c.link, c.gpus),
                                 None if c.host_ram_gb is None else usable_host_gb(c.host_ram_gb))
    return facts


def layout_on(c: Candidate, est: Estimator) -> tuple[tuple[int, int, str, str], str, bool]:
    """(the estimate's key, mode, fits) of the job on this offer: DP/single when it fits
    one card; else ZeRO-3 if the link may shard; either fits only when what it moves to
    host RAM fits the instance too. Judged on the layout's sizes (``est.whole``,
    ``est.sharded``: the estimate itself is built only for the offers shown) and kept for
    the answer (``est.verdicts``)."""
    return layouts_of((c,), est)[0]


def layouts_of(pool: Sequence[Candidate], est: Estimator) -> list[tuple[tuple[int, int, str, str], str, bool]]:
    """``layout_on`` of every offer of the pool, in its order (a verdict already kept for the
    answer is read, not judged again): the same verdicts, in one loop rather than a call
    per offer, since the recommendation judges the whole pool."""
    verdicts, whole, sharded = est.verdicts, est.whole, est.sharded
    out = []
    for c in pool:
        verdict = verdicts.get(id(c))
        if verdict is None:
            facts = _facts.get(id(c))
            if facts is None or facts[0] is not c:
                facts = offer_facts(c)
            _, gpus, usable, data_parallel, shard, host_usable = facts
            per_gpu, host, key = whole.get(gpus) or est.sized(gpus, 0)
            if per_gpu <= usable and data_parallel and (host_usable is None or not host > host_usable):
                verdict = key, "single" if gpus == 1 else "data-parallel", True
            elif shard:
                per_gpu, host, key = sharded.get(gpus) or est.sized(gpus, 3)
                verdict = key, "zero-3", per_gpu <= usable and (host_usable is None or not host > host_usable)
            else:
                verdict = key, "single" if gpus == 1 else "data-parallel", False
            verdicts[id(c)] = verdict
        out.append(verdict)
    return out


def prices(pool: Sequence[Candidate], job: Job, offload: str) -> list[tuple]:
    """``recommend._price`` of every offer of the pool, in its order: the same arithmetic, with what
    the job alone decides worked out once."""
    if job.tokens <= 0:
        return [(c.monthly_cents, c.monthly_cents, -c.total_tflops) for c in pool]
    utilisation, factor, flops = job.utilisation, _factors(job, offload)[0], flops_per_token(job)
    work = job.tokens * job.epochs
    out = []
    ceil = math.ceil
    for c in pool:
        tflops, gpus, monthly = c.bf16_tflops, c.gpus, c.monthly_cents
        if tflops <= 0 or gpus <= 0:
            out.append((monthly, monthly, -c.total_tflops))
            continue
        # rental_to_finish and rental_cents, inline
        run_hours = work / (tflops * 1e12 * utilisation * factor / flops * gpus) / 3600
        rental = min(max(ceil(run_hours / HOURS_PER_WEEK), 1) * c.weekly_cents,
                     max(ceil(run_hours / HOURS_PER_MONTH), 1) * monthly)
        out.append((rental, monthly, -(tflops * gpus)))
    return out
