"""The estimate of one job: the engine's terms (``sizing.engine``) summed per GPU, with the
job's warnings (``sizing.job_warnings``, which read the same terms). Kept apart from the
terms so the warnings can import them without a circle."""

from __future__ import annotations

from .engine import (
    ADAM_STATE_BYTES,
    ADAPTER_ADAM_BYTES,
    ADAPTER_GRAD_BYTES,
    ADAPTER_WEIGHT_BYTES,
    ALLOCATOR_MARGIN,
    CUDA_CONTEXT_GB,
    GB,
    OFFLOADED_BY,
    SHARD_STAGE,
    STATE_KEYS,
    Estimate,
    Job,
    activation_bytes,
    active_params,
    adapter_params,
    checkpoint_gb,
    checkpoint_input_bytes,
    frozen_weight_bytes,
    full_state_bytes_per_param,
    logits_bytes,
    quant_buffer_bytes,
    sharding_buffer_bytes,
    train_flops,
)
from .job_warnings import job_warnings


def layout_free_terms(job: Job) -> dict:
    """The terms no layout of the job changes — activations, logits, the 4-bit buffers, the
    checkpoints on disk, the FLOPs: they depend on the model, the method and the tokens,
    not on the GPU count, ZeRO stage or offload. The recommender sizes one job in several
    layouts (one per card count it meets) and computes these once."""
    n_adapter = 0 if job.method in ADAM_STATE_BYTES else adapter_params(job.arch, job.lora_rank, job.lora_targets)
    return {
        "frozen_weights": frozen_weight_bytes(job.arch, job.method, job.stack.upcast_unquantised),
        # the model states before a layout shards or offloads them, and ZeRO-3's buffers
        "states": _state_totals(job, n_adapter),
        "zero3_buffers": sharding_buffer_bytes(job, (2, 3, job.offload, job.method)),
        "quant_buffers": quant_buffer_bytes(job), "activations": activation_bytes(job),
        "logits": logits_bytes(job.arch, job.seq, job.batch, job.loss_kind),
        "host_checkpoint_inputs": checkpoint_input_bytes(job) if job.checkpointing and job.stack.offloads_checkpoints
        else None,
        "adapter_params": n_adapter, "checkpoint_gb": checkpoint_gb(job, n_adapter),
        "train_flops": train_flops(active_params(job.arch), job.tokens, job.epochs),
    }


def estimate(job: Job, *, warnings: bool = True, terms: dict | None = None,
             layout: tuple[int, int, str, str] | None = None) -> Estimate:
    """Peak GPU memory of one training step, per GPU and in total (all GPUs).
    ``warnings=False`` leaves out the job's warnings (``Estimate.warnings`` is empty): the
    recommender sizes each card's configuration of the job and reads the warnings of the
    job as configured only. ``terms``: ``layout_free_terms`` of this job or of one that
    differs from it only in GPUs, ZeRO stage or offload. ``layout``: (gpus, zero, offload,
    method): the estimate of ``job.laid_out(*layout)`` without that copy of the job (the
    recommender's many layouts of one job); it needs the terms of a job with that method,
    and no warnings (they are the laid-out job's)."""
    if layout is None:
        gpus, zero, offload, method = job.gpus, job.zero, job.offload, job.method
    elif warnings or terms is None:
        raise ValueError("a layout's estimate takes the terms of its method and gives no warnings")
    else:
        gpus, zero, offload, method = layout
    t = layout_free_terms(job) if terms is None else terms
    # ``model_states`` and ``sharding_buffer_bytes`` from the totals in the terms: the same
    # arithmetic, without the per-layout calls (an answer sizes ~8 layouts)
    bd = dict.fromkeys(STATE_KEYS, 0.0)
    host = 0.0
    frozen = t["frozen_weights"]
    if offload == "all":
        host += frozen
    else:
        bd["frozen_weights"] = frozen / gpus if zero >= 3 else frozen
    for key, total, from_stage, offloaded_by in t["states"]:
        if offload in offloaded_by:
            host += total
        else:
            bd[key] += total / gpus if zero >= from_stage else total
    bd["sharding_buffers"] = t["zero3_buffers"] if zero >= 3 and gpus >= 2 else 0.0
    bd["quant_buffers"] = t["quant_buffers"]
    bd["activations"] = t["activations"]
    bd["logits"] = t["logits"]
    if t["host_checkpoint_inputs"] is not None:
        host += t["host_checkpoint_inputs"] * gpus
    allocated = sum(bd.values())
    bd["cuda_context"] = CUDA_CONTEXT_GB * GB
    bd["allocator_margin"] = ALLOCATOR_MARGIN * allocated
    per_gpu = sum(bd.values())
    # bd holds BREAKDOWN_KEYS in their order; positional: Estimate's field order
    return Estimate(job.arch.name, method, job.arch.params, gpus, zero, offload, per_gpu / GB, per_gpu * gpus / GB,
                    host / GB, {k: v / GB for k, v in bd.items()}, dict(t["checkpoint_gb"]), t["adapter_params"],
                    t["train_flops"], tuple(job_warnings(job)) if warnings else (), job.framework)


def _state_totals(job: Job, n_adapter: int) -> tuple:
    """(breakdown key, bytes over all cards, the ZeRO stage that shards them, the offload
    modes that move them to host memory) of each model state, in ``model_states``' order
    and arithmetic: what a layout divides or moves."""
    method = job.method
    if method in ADAM_STATE_BYTES:
        language_params = job.arch.language_params
        return tuple((name, b * language_params, SHARD_STAGE[name], OFFLOADED_BY[name])
                     for name, b in full_state_bytes_per_param(method).items())
    scale = job.stack.adapter_bytes / ADAPTER_WEIGHT_BYTES  # torchtune: bf16 adapters and moments
    return (("adapters", n_adapter * (ADAPTER_WEIGHT_BYTES * scale), 3, ("all",)),
            ("adapters", n_adapter * (ADAPTER_GRAD_BYTES * scale), 2, ("all",)),
            ("adapters", n_adapter * (ADAPTER_ADAM_BYTES * scale), 1, ("optimizer", "all")))


def with_warnings(e: Estimate, warnings: tuple[str, ...]) -> Estimate:
    """``dataclasses.replace(e, warnings=warnings)`` through the constructor (replace's
    per-field bookkeeping was a visible share of the recommendation's own estimate)."""
    return Estimate(e.model, e.method, e.params, e.gpus, e.zero, e.offload, e.per_gpu_gb, e.total_gb, e.host_ram_gb,
                    e.breakdown_gb, e.checkpoint_gb, e.adapter_params, e.train_flops, warnings, e.framework)
