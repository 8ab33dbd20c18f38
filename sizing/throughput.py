"""Tokens per second of a fine-tuning job on a card, and so the time and the cost to finish it.

Pure Python, no Django. The model (docs/adr/0012-sizing-measured-and-time-to-finish.md;
sources and the figures they imply in sizing/CALIBRATION.md, "Throughput"):

* **FLOPs the card runs per token** (hardware FLOPs, recomputation included): each
  parameter a token runs through costs 2 FLOPs in the forward pass, 2 for the gradient of
  its input, 2 for the gradient of its weight (full fine-tune only: LoRA's frozen weights
  need none, its adapters are a rounding error) and 2 more when checkpointing recomputes
  the forward; attention adds 4·s·q per layer in the forward pass (QKᵀ and AV, the count
  MosaicML's llm-foundry uses), twice that in the backward, once more with recomputation.
  So 6·N per token for a full fine-tune without checkpointing (Kaplan's 6·N·D), 8·N with
  it, 4·N and 6·N for LoRA.
* **what a card delivers**: its dense BF16 tensor TFLOPS (the catalog's figure) times a
  utilisation of ``UTILISATION`` (range ``UTILISATION_RANGE``), calibrated on published
  throughput: MosaicML's llm-foundry tables (H100 and A100, MPT 1B-70B, 39-64 % of peak
  counted this way) and torchtune's README (single-card Llama 3.1 8B runs); a plain
  Hugging Face Trainer step without torch.compile sits at the lower end.
* **4-bit**: dequantising the weights costs ``QLORA_SPEED`` of bf16 LoRA's speed (SPEC: 20-40 %
  slower; torchtune's QLoRA runs 0.78 times as fast as its LoRA on the same card);
  **offload** to host memory ``OFFLOAD_SPEED`` (SPEC: 20-50 % slower).
* **several cards** add their rates (data-parallel and ZeRO within one NVLink node).

The range: the lowest and highest utilisation (and factor) give the slowest and fastest
likely rate; the wall-clock time and the rental for the whole job follow from each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .engine import ADAM_STATE_BYTES, DEFAULT_UTILISATION, Job, active_params
from .frozen import quick_init

#: FLOPs per parameter per token, by pass (2 = one multiply-add)
FORWARD_FLOPS = 2.0
INPUT_GRAD_FLOPS = 2.0
WEIGHT_GRAD_FLOPS = 2.0
RECOMPUTE_FLOPS = 2.0
#: attention FLOPs per token per layer in the forward pass: 4·s·(heads × head_dim)
ATTENTION_FLOPS = 4.0

#: share of the dense BF16 peak a fine-tuning step keeps busy, counted on the FLOPs above;
#: central figure and (slow, fast) bounds. CALIBRATION.md shows the published figures.
UTILISATION = DEFAULT_UTILISATION
UTILISATION_RANGE = (0.25, 0.75)
#: speed relative to bf16 LoRA of the same job: 4-bit dequantisation; states offloaded to host
QLORA_SPEED = (0.75, 0.6, 0.8)  # central, slow, fast
OFFLOAD_SPEED = (0.65, 0.5, 0.8)



@dataclass(frozen=True, slots=True)
class Published:
    """A published training throughput: tokens/s per GPU for a setup, on a card of
    ``tflops`` dense BF16 TFLOPS. ``utilisation`` is what it implies under this model."""

    source: str
    setup: str
    job: Job
    tflops: float
    tokens_per_s_per_gpu: float

    @property
    def utilisation(self) -> float:
        return self.tokens_per_s_per_gpu * flops_per_token(self.job) / (self.tflops * 1e12)


def _published() -> tuple[Published, ...]:
    from .presets import PRESETS, Architecture

    def mpt(name: str, params: int, hidden: int, layers: int) -> Architecture:
        return Architecture(name, hidden, 4 * hidden, layers, hidden // 128, hidden // 128, 50368,
                            params_override=params)

    foundry = "MosaicML llm-foundry, scripts/train/benchmarking/README.md"
    m7, m13 = mpt("mpt-7b", 6_658_859_008, 4096, 32), mpt("mpt-13b", 12_853_954_560, 5120, 40)
    m7_4k = mpt("mpt-7b", 6_667_247_616, 4096, 32)
    rows = []
    for card, tflops, figures in (("H100 80GB", 989, (10643, 4792, 8611)), ("A100 80GB", 312, (4641, 2262, 3684))):
        for (arch, seq, ckpt, what), tps in zip(((m7, 2048, False, "MPT-7B"), (m13, 2048, False, "MPT-13B"),
                                                  (m7_4k, 4096, True, "MPT-7B")), figures, strict=True):
            rows.append(Published(f"{foundry} ({card} BF16 table)",
                                  f"{what} full training, seq {seq}, 8 GPUs FSDP, amp_bf16, "
                                  f"activation checkpointing {'on' if ckpt else 'off'}",
                                  Job(arch, "full", seq=seq, checkpointing=ckpt), tflops, tps))
    rows.append(Published("torchtune README, “Memory and training speed” (Llama 3.1)",
                          "Llama 3.1 70B LoRA, 8× A100, batch 2, packed to 2,048, torch.compile: 3,497 tokens/s "
                          "in all (activation checkpointing: the recipe's default)",
                          Job(PRESETS["llama-3.1-70b"], "lora", seq=2048, batch=2, checkpointing=True), 312,
                          3497 / 8))
    return tuple(rows)


HOURS_PER_WEEK = 168
HOURS_PER_MONTH = 720


def flops_per_token(job: Job) -> float:
    """Hardware FLOPs one trained token costs (module docstring); kept on the architecture
    (the recommender prices every offer of one job with it)."""
    a = job.arch
    key = ("flops_per_token", job.method in ADAM_STATE_BYTES, job.checkpointing, job.seq)
    value = a._derived.get(key)  # a new length or method is no KeyError raised and caught
    if value is None:
        value = a._derived[key] = _flops_per_token(job)
    return value


def _flops_per_token(job: Job) -> float:
    a = job.arch
    per_param = FORWARD_FLOPS + INPUT_GRAD_FLOPS
    if job.method in ADAM_STATE_BYTES:
        per_param += WEIGHT_GRAD_FLOPS
    passes = 3.0  # attention: forward, and its backward at twice the forward
    if job.checkpointing:
        per_param += RECOMPUTE_FLOPS
        passes += 1.0
    attention = ATTENTION_FLOPS * job.seq * a.heads * a.head_dim * a.layers * passes
    return per_param * active_params(a) + attention


def _factors(job: Job, offload: str | None = None) -> tuple[float, float, float]:
    """(central, slow, fast) speed factor of the method and the offload (``offload``: the
    plan's, where it differs from the job's)."""
    c, s, f = QLORA_SPEED if job.method == "qlora" else (1.0, 1.0, 1.0)
    if (job.offload if offload is None else offload) != "none":
        c, s, f = c * OFFLOAD_SPEED[0], s * OFFLOAD_SPEED[1], f * OFFLOAD_SPEED[2]
    return c, s, f


@quick_init  # built by the dozen per answer (sizing.frozen)
@dataclass(frozen=True, slots=True)
class Speed:
    """Tokens per second of the whole offer (all its cards): central, slow and fast."""

    per_gpu: float
    tokens_per_s: float
    slow: float
    fast: float


def speed(job: Job, tflops_per_gpu: float, gpus: int, offload: str | None = None) -> Speed | None:
    """The job's tokens/s on ``gpus`` cards of ``tflops_per_gpu`` dense BF16 TFLOPS; None
    for a card without a TFLOPS figure. ``job.utilisation`` is the central utilisation (the
    user's, or ``UTILISATION``); the range scales with it. ``offload``: the plan's, where it
    differs from the job's (the same as ``replace(job, offload=offload)``, without the copy)."""
    if tflops_per_gpu <= 0 or gpus <= 0:
        return None
    f = flops_per_token(job)
    c, s, fast = _factors(job, offload)
    u = job.utilisation
    lo, hi = u * UTILISATION_RANGE[0] / UTILISATION, u * UTILISATION_RANGE[1] / UTILISATION
    per_gpu = tflops_per_gpu * 1e12 * u * c / f
    return Speed(per_gpu=per_gpu, tokens_per_s=per_gpu * gpus,
                 slow=tflops_per_gpu * 1e12 * lo * s / f * gpus,
                 fast=tflops_per_gpu * 1e12 * min(hi, 1.0) * fast / f * gpus)


def hours(tokens: float, tokens_per_s: float) -> float:
    return tokens / tokens_per_s / 3600


def rental_cents(run_hours: float, weekly_cents: int, monthly_cents: int) -> int:
    """What renting the offer long enough costs under its lease terms: whole weeks or whole
    months, whichever is less (a 30-hour job on a weekly lease pays a week)."""
    weeks = max(math.ceil(run_hours / HOURS_PER_WEEK), 1)
    months = max(math.ceil(run_hours / HOURS_PER_MONTH), 1)
    return min(weeks * weekly_cents, months * monthly_cents)


def rental_to_finish(job: Job, tflops_per_gpu: float, gpus: int, weekly_cents: int,
                     monthly_cents: int, offload: str | None = None) -> int | None:
    """``finish(...).rental_cents`` alone (what offers are ranked by), without the range."""
    if job.tokens <= 0 or tflops_per_gpu <= 0 or gpus <= 0:
        return None
    rate = tflops_per_gpu * 1e12 * job.utilisation * _factors(job, offload)[0] / flops_per_token(job) * gpus
    return rental_cents(job.tokens * job.epochs / rate / 3600, weekly_cents, monthly_cents)


@quick_init  # built by the dozen per answer (sizing.frozen)
@dataclass(frozen=True, slots=True)
class Finish:
    """Time and money to finish the job on one offer (hours, USD cents), with the range."""

    speed: Speed
    hours: float
    hours_range: tuple[float, float]  # (fast, slow)
    rental_cents: int
    rental_range_cents: tuple[int, int]
    compute_cents: int


def finish(job: Job, tflops_per_gpu: float, gpus: int, weekly_cents: int, monthly_cents: int,
           offload: str | None = None) -> Finish | None:
    """Time and cost to train ``job.tokens × job.epochs`` tokens; None without tokens or
    without a TFLOPS figure. ``offload`` as in :func:`speed`."""
    if job.tokens <= 0:
        return None
    sp = speed(job, tflops_per_gpu, gpus, offload)
    if sp is None:
        return None
    total = job.tokens * job.epochs
    h, h_fast, h_slow = hours(total, sp.tokens_per_s), hours(total, sp.fast), hours(total, sp.slow)
    return Finish(
        speed=sp, hours=h, hours_range=(h_fast, h_slow),
        rental_cents=rental_cents(h, weekly_cents, monthly_cents),
        rental_range_cents=(rental_cents(h_fast, weekly_cents, monthly_cents),
                            rental_cents(h_slow, weekly_cents, monthly_cents)),
        compute_cents=round(h * monthly_cents / HOURS_PER_MONTH))


#: published throughput the utilisation range is held to (tests/sizing/test_throughput.py)
PUBLISHED = _published()
