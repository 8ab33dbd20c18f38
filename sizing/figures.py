"""Figures the pages quote, computed by the engine (never typed in).

Pure Python, no Django: the views pass in the catalog's candidates. Row definitions only
name *what* is sized (model, method, vendor filter); every GB and card comes from
:func:`sizing.estimate` and :func:`sizing.recommend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from django.utils.translation import gettext_lazy

from .engine import Estimate, Job, activation_bytes, zero_bytes_per_param
from .estimation import estimate
from .frameworks import DEFAULT_FRAMEWORK
from .presets import PRESETS
from .recommend import Candidate, Recommendation, recommend, usable_gb

GB = 1e9

#: The one set of assumptions of every figure the pages quote: the calculator's
#: defaults — Hugging Face Trainer/PEFT (the stock stack), FlashAttention-2, gradient
#: checkpointing, sequence 2,048, micro-batch 1, rank-16 adapters on all linear layers — so
#: a row of the tables or an FAQ figure opened in the calculator gives the same number. The
#: source documents' own assumptions (torchtune terms, eager attention) are kept for the
#: engine's calibration tests (sizing/CALIBRATION.md), not for the pages.
PAGE_JOB = {"seq": 2048, "batch": 1, "checkpointing": True, "flash_attention": True,
            "lora_rank": 16, "framework": DEFAULT_FRAMEWORK}
#: The calculator's parameters for PAGE_JOB (its form's defaults are the same values).
PAGE_QUERY = {"seq": 2048, "batch": 1, "checkpointing": "on", "flash_attention": "on", "lora_rank": 16,
              "lora_targets": "all", "framework": DEFAULT_FRAMEWORK}


@dataclass(frozen=True)
class RowSpec:
    label: str
    model: str
    method: str
    vendor: str = "any"
    gpus: int = 1
    zero: int = 0


def calculator_query(model: str, method: str, vendor: str = "any", gpus: int = 1, zero: int = 0,
                     offload: str = "none") -> dict:
    """The calculator's inputs that reproduce a figure of the pages."""
    return {"model": model, "method": method, **PAGE_QUERY, "gpus": gpus, "zero": zero, "offload": offload,
            "vendor": vendor}


#: the first document's rows; "7B full" is its "cheapest CUDA path", the rest allow ROCm
FIRST_DOC_ROWS = (
    RowSpec("7B QLoRA", "llama-2-7b", "qlora"),
    RowSpec("13B QLoRA", "llama-2-13b", "qlora"),
    RowSpec("7B LoRA", "llama-2-7b", "lora"),
    RowSpec("34B QLoRA", "codellama-34b", "qlora"),
    RowSpec("13B LoRA", "llama-2-13b", "lora"),
    RowSpec("70B QLoRA", "llama-2-70b", "qlora"),
    RowSpec("34B LoRA", "codellama-34b", "lora"),
    RowSpec(gettext_lazy("7B full (CUDA only)"), "llama-2-7b", "full", vendor="cuda"),
    RowSpec(gettext_lazy("70B LoRA, one card"), "llama-2-70b", "lora"),
    RowSpec(gettext_lazy("70B full, ZeRO-3 across a node"), "llama-2-70b", "full", gpus=8, zero=3),
)

#: the second document's scales (Qwen2.5 family; 7B stands for "7B / 8B")
SCALE_ROWS = (("7B / 8B", "qwen2.5-7b"), ("14B", "qwen2.5-14b"), ("32B", "qwen2.5-32b"),
              ("72B", "qwen2.5-72b"))

#: the ZeRO table's example: the 32B of the scale table (qwen2.5-32b) on an 8-card node
ZERO_EXAMPLE_MODEL = "qwen2.5-32b"
ZERO_EXAMPLE_GPUS = 8
ZERO_EXAMPLE_CARD_GB = 80
ZERO_STAGES = (("ZeRO-1", 1, "none"), ("ZeRO-2", 2, "none"), ("ZeRO-3", 3, "none"),
               ("ZeRO-Offload", 3, "optimizer"))


def job_for(model: str, method: str, settings: dict, **kw) -> Job:
    return Job(PRESETS[model], method, **{**settings, **kw})


@dataclass(frozen=True)
class TableRow:
    label: str
    model: str
    method: str
    vendor: str
    need: Estimate
    recommendation: Recommendation
    query: dict = field(default_factory=dict)  # the calculator's inputs for this row

    @property
    def need_gb(self) -> float:
        """Total memory the job needs (all cards for a sharded row)."""
        return self.need.total_gb

    @property
    def best(self):
        return self.recommendation.best


def first_document_table(candidates: list[Candidate]) -> list[TableRow]:
    rows = []
    for r in FIRST_DOC_ROWS:
        job = job_for(r.model, r.method, PAGE_JOB, gpus=r.gpus, zero=r.zero)
        rec = recommend(job, candidates, vendor=r.vendor)
        rows.append(TableRow(r.label, r.model, r.method, r.vendor, estimate(job), rec,
                             calculator_query(r.model, r.method, r.vendor, r.gpus, r.zero)))
    return rows


def scale_table(candidates: list[Candidate]) -> list[dict]:
    """Second document: per scale, QLoRA and LoRA with the engine's figure and card."""
    out = []
    for label, model in SCALE_ROWS:
        cells = {}
        for method in ("qlora", "lora"):
            job = job_for(model, method, PAGE_JOB)
            cells[method] = TableRow(label, model, method, "any", estimate(job),
                                     recommend(job, candidates, vendor="any"), calculator_query(model, method))
        out.append({"label": label, "model": model, **cells})
    return out


def zero_table() -> list[dict]:
    """A 32B full fine-tune on 8 cards, per ZeRO stage: the model states each card holds and
    the whole per-card figure the calculator shows (activations, logits, buffers and runtime
    on top). "Fits" is that figure against the card's usable memory, the recommender's rule."""
    usable = usable_gb(ZERO_EXAMPLE_CARD_GB)
    rows = []
    for label, stage, offload in ZERO_STAGES:
        e = estimate(job_for(ZERO_EXAMPLE_MODEL, "full", PAGE_JOB, gpus=ZERO_EXAMPLE_GPUS, zero=stage,
                             offload=offload))
        rows.append({"label": label, "stage": stage, "offload": offload,
                     "bytes_per_param": zero_bytes_per_param("full", stage, ZERO_EXAMPLE_GPUS, offload),
                     "states_gb": e.model_state_gb, "per_card_gb": e.per_gpu_gb, "fits": e.per_gpu_gb <= usable,
                     "query": calculator_query(ZERO_EXAMPLE_MODEL, "full", "any", ZERO_EXAMPLE_GPUS, stage, offload)})
    return rows


def zero_example_params_b() -> int:
    return round(PRESETS[ZERO_EXAMPLE_MODEL].params / 1e9)


def _gb(x: float) -> float:
    return x / GB


def memory_switches() -> dict[str, float]:
    """The figures quoted by the memory-switches explanation (7B = llama-2-7b)."""
    n = PRESETS["llama-2-7b"].params
    lora = job_for("llama-2-7b", "lora", PAGE_JOB)
    no_ckpt = replace(lora, checkpointing=False)
    full_eager = job_for("llama-2-7b", "full", PAGE_JOB, checkpointing=False)
    b1 = estimate(lora).per_gpu_gb
    return {
        "master_moments_gb": 12 * n / GB,
        "activations_bf16_gb": _gb(activation_bytes(full_eager)),
        "activations_fp32_gb": 2 * _gb(activation_bytes(full_eager)),
        "act_ckpt_gb": _gb(activation_bytes(lora)),
        "act_no_ckpt_gb": _gb(activation_bytes(no_ckpt)),
        "ckpt_cut_pct": 100 * (1 - activation_bytes(lora) / activation_bytes(no_ckpt)),
        "full_states_gb": zero_bytes_per_param("full", 0, 1) * n / GB,
        "full8_states_gb": zero_bytes_per_param("full-8bit", 0, 1) * n / GB,
        "batch1_gb": b1,
        "batch8_gb": estimate(replace(lora, batch=8)).per_gpu_gb,
        "lora_gb": b1,
        "qlora_gb": estimate(replace(lora, method="qlora")).per_gpu_gb,
    }


def faq_vram_figures() -> dict[str, int]:
    """The FAQ's figures in whole GB: 7B (llama-2-7b) QLoRA/LoRA/full, 70B (llama-2-70b)
    QLoRA/LoRA, under the pages' assumptions (PAGE_JOB, the calculator's defaults)."""
    keys = {"q7": ("llama-2-7b", "qlora"), "l7": ("llama-2-7b", "lora"),
            "f7": ("llama-2-7b", "full"), "q70": ("llama-2-70b", "qlora"),
            "l70": ("llama-2-70b", "lora")}
    return {k: round(estimate(job_for(m, meth, PAGE_JOB)).per_gpu_gb)
            for k, (m, meth) in keys.items()}
