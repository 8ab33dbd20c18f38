"""Published measured peak-memory figures the engine is checked against (pure data).

Each row names its source (document and table), the setup the source states, and the
measured figure converted to decimal GB. ``bound=True`` marks "largest context that fits
on a card of X GB" rows: the real peak is at most the card's memory, so the engine should
come out at or a little above it. Card and PyTorch figures written "GB"/"GiB" are binary
(a "16 GB" card has 16 GiB); they are converted with ``GIB``.

``confidence``: "stated" — figures and setup as the source prints them; "recalled" — the
figure is quoted from the source from memory, and part of the setup (written in
``assumed``) is the recipe's default rather than printed next to the figure. Tests hold
every row to ratio ≥ 0.9; ``python -m sizing.measured`` prints the table in CALIBRATION.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

GIB = 1024**3 / 1e9

UNSLOTH_README = "Unsloth README, “Context length benchmarks”"
UNSLOTH_8B = ("Llama 3.1 8B Instruct, 4-bit QLoRA on q,k,v,o,gate,up,down, rank 32, batch 1, "
              "padded to the max length, gradient checkpointing")
UNSLOTH_70B = "Llama 3.3 70B Instruct, same setup"
TORCHTUNE_README = "torchtune README, “Memory and training speed” (Llama 3.1)"
TORCHTUNE_SETUP = "batch 2, dataset packed to 2,048, torch.compile, no gradient accumulation"
LONGLORA = "LongLoRA (Chen et al. 2024), efficiency table, Llama 2 7B"


@dataclass(frozen=True)
class Measured:
    source: str
    setup: str
    measured_gb: float  # decimal GB
    job: dict  # parse_request parameters reproducing the setup
    bound: bool = False
    confidence: str = "stated"
    assumed: str = ""
    #: "card": what the card held (its memory, nvidia-smi); "torch": PyTorch's own counters
    #: (``torch.cuda.max_memory_*``), which leave out the CUDA context, so the engine's
    #: context term is left out of the comparison
    counted: str = "card"

    @property
    def label(self) -> str:
        return f"{self.job.get('model')} {self.job.get('method')} {self.job.get('framework')}" \
               f" seq {self.job.get('seq')}×{self.job.get('batch', 1)}"


def _unsloth(model: str, framework: str, card_gib: int, context: int) -> Measured:
    return Measured(
        UNSLOTH_README + (" (Unsloth column)" if framework == "unsloth" else " (HF + FA2 column)"),
        (UNSLOTH_8B if model == "llama-3.1-8b" else UNSLOTH_70B) + f"; max context {context:,} on {card_gib} GB",
        card_gib * GIB,
        {"model": model, "method": "qlora", "seq": context, "batch": 1, "lora_rank": 32,
         "lora_targets": "all", "checkpointing": True, "framework": framework},
        bound=True, assumed="optimizer not stated (engine: AdamW fp32 on the adapters)",
    )


ROWS: tuple[Measured, ...] = (
    *(_unsloth("llama-3.1-8b", "hf", gib, ctx) for gib, ctx in (
        (12, 932), (16, 2551), (24, 5789), (40, 12264), (48, 15502), (80, 28454))),
    _unsloth("llama-3.1-70b", "hf", 80, 6916),
    *(_unsloth("llama-3.1-8b", "unsloth", gib, ctx) for gib, ctx in (
        (8, 2972), (12, 21848), (16, 40724), (24, 78475), (40, 153977), (48, 191728),
        (80, 342733))),
    _unsloth("llama-3.1-70b", "unsloth", 48, 12106),
    _unsloth("llama-3.1-70b", "unsloth", 80, 89389),
    Measured(TORCHTUNE_README, f"Llama 3.1 8B LoRA, 1× RTX 4090, {TORCHTUNE_SETUP}", 16.2 * GIB,
             {"model": "llama-3.1-8b", "method": "lora", "seq": 2048, "batch": 2, "lora_rank": 8,
              "lora_targets": "q,v,o,gate,up,down", "checkpointing": True,
              "framework": "torchtune-compile"},
             confidence="recalled", counted="torch",
             assumed="rank 8 on q,v,output + MLP and activation checkpointing (recipe defaults)"),
    Measured(TORCHTUNE_README, f"Llama 3.1 8B QLoRA, 1× RTX 4090, {TORCHTUNE_SETUP}", 7.4 * GIB,
             {"model": "llama-3.1-8b", "method": "qlora", "seq": 2048, "batch": 2, "lora_rank": 8,
              "lora_targets": "q,v,o,gate,up,down", "checkpointing": True,
              "framework": "torchtune-compile"},
             confidence="recalled", counted="torch",
             assumed="rank 8 on q,v,output + MLP and activation checkpointing (recipe defaults)"),
    Measured(TORCHTUNE_README, f"Llama 3.1 70B LoRA, 8× A100, per GPU, {TORCHTUNE_SETUP}", 27.6 * GIB,
             {"model": "llama-3.1-70b", "method": "lora", "seq": 2048, "batch": 2, "lora_rank": 16,
              "lora_targets": "q,v,o,gate,up,down", "checkpointing": True,
              "framework": "torchtune-compile", "gpus": 8, "zero": 3},
             confidence="recalled", counted="torch",
             assumed="FSDP full shard, rank 16, activation checkpointing (recipe defaults)"),
    Measured(LONGLORA, "plain LoRA (rank 8, q,k,v,o), context 8,192, FlashAttention-2, DeepSpeed "
             "ZeRO-2 on 8× A100, batch 1 per GPU, per GPU", 25.7 * GIB,
             {"model": "llama-2-7b", "method": "lora", "seq": 8192, "batch": 1, "lora_rank": 8,
              "lora_targets": "q,k,v,o", "checkpointing": True, "framework": "hf", "gpus": 8,
              "zero": 2},
             confidence="recalled", assumed="gradient checkpointing on; the GB read as GiB"),
)

#: the aim: no row under this ratio, few above ``HIGH_RATIO``
MIN_RATIO = 0.9
HIGH_RATIO = 1.6


def ratio(row: Measured) -> float:
    """engine per-GPU GB / measured GB."""
    return engine_gb(row) / row.measured_gb


def engine_gb(row: Measured) -> float:
    """The engine's per-GPU GB for the row's setup, counted as the source counted (without
    the CUDA context for PyTorch's counters)."""
    from .estimation import estimate
    from .inputs import parse_request

    e = estimate(parse_request(row.job).job)
    return e.per_gpu_gb - (e.breakdown_gb["cuda_context"] if row.counted == "torch" else 0.0)


def summary() -> dict:
    ratios = [ratio(r) for r in ROWS]
    return {"rows": len(ROWS), "median": statistics.median(ratios), "min": min(ratios),
            "max": max(ratios), "over_high": sum(r > HIGH_RATIO for r in ratios)}


def markdown() -> str:
    """The CALIBRATION.md table (engine figures computed, never typed)."""
    lines = ["| source | setup | framework | measured GB | engine GB | engine/measured | confidence |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in ROWS:
        gb = engine_gb(r)
        measured = f"≤{r.measured_gb:.1f}" if r.bound else f"{r.measured_gb:.1f}"
        note = r.confidence + (f" ({r.assumed})" if r.assumed else "")
        lines.append(f"| {r.source} | {r.setup} | {r.job['framework']} | {measured} | {gb:.1f} | "
                     f"{gb / r.measured_gb:.2f} | {note} |")
    s = summary()
    lines.append(f"\n{s['rows']} rows: median {s['median']:.2f}, min {s['min']:.2f}, max {s['max']:.2f}, "
                 f"{s['over_high']} above {HIGH_RATIO}.")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - prints the CALIBRATION.md table
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.test_settings")
    django.setup()
    print(markdown())
