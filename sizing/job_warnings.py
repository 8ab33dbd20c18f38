"""Card-independent warnings about a job (card-dependent ones come from ``recommend``)."""

from __future__ import annotations

from dataclasses import replace

from django.utils.translation import gettext_noop

from .engine import (
    GB,
    LOSS_ADVICE_GB,
    MAX_NODE_GPUS,
    Job,
    activation_bytes,
    active_params,
    logits_bytes,
)
from .frameworks import FRAMEWORKS
from .hf_config import STRETCHING_ROPE
from .texts import Texts, texts


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f}"


def context_warnings(job: Job, tr: Texts) -> list[str]:
    a, w = job.arch, []
    if job.seq > a.max_context:
        w.append(tr[gettext_noop("Sequence %(seq)s is beyond %(model)s's context of %(context)s tokens; quality "
                                 "degrades without RoPE scaling.")]
                 % {"seq": job.seq, "model": a.name, "context": a.max_context})
    elif a.rope and a.rope.kind in STRETCHING_ROPE and job.seq > a.rope.original_context:
        w.append(tr[gettext_noop("Sequence %(seq)s is beyond the %(orig)s tokens %(model)s was pre-trained on; its "
                                 "config stretches RoPE (%(kind)s ×%(factor)s) to reach it. Expect weaker quality out "
                                 "there, and fine-tune at the length you will serve.")]
                 % {"seq": job.seq, "orig": a.rope.original_context, "model": a.name,
                    "kind": a.rope.kind, "factor": f"{a.rope.factor:g}"})
    if not job.checkpointing and job.seq >= 4096:
        w.append(tr[gettext_noop("Gradient checkpointing is off: activations grow linearly with layers; "
                                 "it is a must for long context (cuts activations 60–80%).")])
    return w


def loss_warnings(job: Job, tr: Texts) -> list[str]:
    kind = job.loss_kind
    here = logits_bytes(job.arch, job.seq, job.batch, kind)
    if kind == "unfused":
        fused = logits_bytes(job.arch, job.seq, job.batch, "fused")
        if here - fused >= LOSS_ADVICE_GB * GB:
            return [tr[gettext_noop("The Hugging Face loss materialises the logits in fp32: %(gb)s GB per GPU here. A "
                                    "fused cross-entropy (framework=liger or unsloth) keeps only a chunk, %(fused)s GB.")]
                    % {"gb": _gb(here), "fused": _gb(fused)}]
        return []
    extra = logits_bytes(job.arch, job.seq, job.batch, "unfused") - here
    if extra >= LOSS_ADVICE_GB * GB:
        return [tr[gettext_noop("This assumes a fused or chunked cross-entropy loss (%(stack)s). A training loop that "
                                "materialises fp32 logits, softmax and their gradient (stock Hugging Face: framework=hf, "
                                "loss=unfused) needs about %(gb)s GB more per GPU.")]
                % {"stack": FRAMEWORKS[job.framework].label if job.loss == "auto" else f"loss={kind}",
                   "gb": _gb(extra)}]
    return []


def four_bit_warnings(job: Job, tr: Texts) -> list[str]:
    if job.method != "qlora" or job.checkpointing or not job.stack.saves_4bit_inputs:
        return []
    extra = activation_bytes(job) - activation_bytes(replace(job, checkpointing=True))
    return [tr[gettext_noop("Without gradient checkpointing the 4-bit path keeps every layer's activations and the "
                            "bf16 input of each 4-bit linear: %(gb)s GB more per GPU than with it.")] % {"gb": _gb(extra)}]


def family_warnings(job: Job, tr: Texts) -> list[str]:
    a, w = job.arch, []
    if a.moe:
        w.append(tr[gettext_noop("Mixture of experts: all %(n)s experts' weights stay in memory (%(total)s B parameters) "
                                 "though each token runs through %(k)s of them (%(active)s B active): memory follows the "
                                 "total, compute the active count.")]
                 % {"n": a.moe.experts, "k": a.moe.per_token, "total": f"{a.params / 1e9:.1f}",
                    "active": f"{active_params(a) / 1e9:.1f}"})
    if a.vision_params:
        w.append(tr[gettext_noop("Vision tower of %(b)s B parameters, kept frozen in bf16; image tokens count in the "
                                 "sequence length.")] % {"b": f"{a.vision_params / 1e9:.2f}"})
    return w


def job_warnings(job: Job, tr: Texts | None = None) -> list[str]:
    """The job's warnings in the language of ``tr`` (the active one's texts table when not
    given: one look-up of the language, where ``gettext`` looked it up per text)."""
    tr = texts() if tr is None else tr
    w = context_warnings(job, tr) + family_warnings(job, tr)
    if job.gpus > MAX_NODE_GPUS:
        w.append(tr[gettext_noop("%(gpus)s GPUs is more than one 8-GPU node: nodes here have at most 8 GPUs, an "
                                 "on-demand cluster provider fits better.")] % {"gpus": job.gpus})
    if job.offload != "none":
        w.append(tr[gettext_noop("Offload to host memory costs 20–50% throughput (extra PCIe and CPU time).")])
    w += loss_warnings(job, tr) + four_bit_warnings(job, tr)
    if job.method == "qlora" and job.zero == 3 and job.gpus > 1:
        w.append(tr[gettext_noop("Sharding a 4-bit base (FSDP-QLoRA) needs a recent bitsandbytes/PEFT stack.")])
    return w
