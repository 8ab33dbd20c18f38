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
    BF16_WEIGHT_BYTES,
    BREAKDOWN_KEYS,
    CUDA_CONTEXT_GB,
    DEQUANT_WEIGHT_BYTES,
    FLOPS_PER_PARAM_TOKEN,
    GB,
    OFFLOADED_BY,
    SHARD_STAGE,
    STATE_KEYS,
    Estimate,
    Job,
    activation_bytes,
    active_params,
    adapter_params,
    checkpoint_input_bytes,
    frozen_weight_bytes,
    full_state_bytes_per_param,
    logits_bytes,
)
from .frameworks import FRAMEWORKS
from .job_warnings import job_warnings


def layout_free_terms(job: Job) -> dict:
    """The terms no layout of the job changes — activations, logits, the 4-bit buffers, the
    checkpoints on disk, the FLOPs: they depend on the model, the method and the tokens,
    not on the GPU count, ZeRO stage or offload. The recommender sizes one job in several
    layouts (one per card count it meets) and computes these once. The engine's term
    functions' arithmetic, with what they each looked up (the stack, the parameter count)
    read once (tests/sizing/test_fast_paths.py holds it to the calls it replaced)."""
    arch, method = job.arch, job.method
    stack = FRAMEWORKS[job.framework]
    params = arch.params
    full = method in ADAM_STATE_BYTES
    n_adapter = 0 if full else adapter_params(arch, job.lora_rank, job.lora_targets)
    frozen = frozen_weight_bytes(arch, method, stack.upcast_unquantised)
    # ZeRO-3's buffers (sharding_buffer_bytes on 2+ cards): two layers of bf16 weights, or of
    # the frozen weights as stored (never upcast: LoRA's do not depend on it)
    if full:
        per_param = BF16_WEIGHT_BYTES
    elif method == "lora" or not stack.upcast_unquantised:
        per_param = frozen / params
    else:
        per_param = frozen_weight_bytes(arch, method) / params
    # checkpoint_gb: what resuming needs, the bf16 model, the adapter alone
    if full:
        resume, adapter = _FULL_RESUME_BYTES[method] * arch.language_params, 0.0
    else:
        resume = (ADAPTER_WEIGHT_BYTES + ADAPTER_GRAD_BYTES + ADAPTER_ADAM_BYTES) * n_adapter
        adapter = ADAPTER_WEIGHT_BYTES * n_adapter
    return {
        "frozen_weights": frozen,
        # the model states before a layout shards or offloads them, and ZeRO-3's buffers
        "state_slots": _state_totals(job, n_adapter),
        "zero3_buffers": 2 * per_param * params / arch.layers,
        "quant_buffers": DEQUANT_WEIGHT_BYTES * arch.largest_linear if method == "qlora" else 0.0,
        "activations": activation_bytes(job),
        "logits": logits_bytes(arch, job.seq, job.batch, stack.loss if job.loss == "auto" else job.loss),
        "host_checkpoint_inputs": checkpoint_input_bytes(job) if job.checkpointing and stack.offloads_checkpoints
        else None,
        "adapter_params": n_adapter,
        "checkpoint_gb": {"resume_with_optimizer": resume / GB, "bf16_weights": BF16_WEIGHT_BYTES * params / GB,
                          "adapter": adapter / GB},
        "train_flops": FLOPS_PER_PARAM_TOKEN * (active_params(arch) if arch.moe else params) * job.tokens * job.epochs,
    }


#: a full fine-tune's resume checkpoint, bytes per parameter (checkpoint_gb's sum, per method)
_FULL_RESUME_BYTES = {method: sum(full_state_bytes_per_param(method).values()) for method in ADAM_STATE_BYTES}


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
    terms_bytes, host = layout_bytes(t, gpus, zero, offload)
    # terms_bytes holds BREAKDOWN_KEYS' values in their order; positional: Estimate's field order
    per_gpu = sum(terms_bytes)
    return Estimate(job.arch.name, method, job.arch.params, gpus, zero, offload, per_gpu / GB, per_gpu * gpus / GB,
                    host / GB, dict(zip(BREAKDOWN_KEYS, [v / GB for v in terms_bytes], strict=True)), dict(t["checkpoint_gb"]),
                    t["adapter_params"], t["train_flops"], tuple(job_warnings(job)) if warnings else (), job.framework)


def layout_bytes(t: dict, gpus: int, zero: int, offload: str) -> tuple[list[float], float]:
    """(each breakdown term's bytes per GPU, in ``BREAKDOWN_KEYS``' order; bytes moved to
    host memory) of a job in this layout, from its ``layout_free_terms``: ``model_states``
    and ``sharding_buffer_bytes`` worked from the totals in the terms (the same arithmetic,
    without the per-layout calls)."""
    out, host = _states_and_host(t, gpus, zero, offload)
    out.append(t["zero3_buffers"] if zero >= 3 and gpus >= 2 else 0.0)
    out.append(t["quant_buffers"])
    out.append(t["activations"])
    out.append(t["logits"])
    allocated = sum(out)
    out.append(CUDA_CONTEXT_GB * GB)
    out.append(ALLOCATOR_MARGIN * allocated)
    return out, host


def layout_sizes(t: dict, gpus: int, zero: int, offload: str) -> tuple[float, float]:
    """(``per_gpu_gb``, ``host_ram_gb``) of ``estimate`` in this layout, to the bit, without
    the estimate (its breakdown and checkpoint dicts, the object): ``layout_bytes``' sums in
    their order (allocated, then the context and the margin), without its list. The
    recommender judges ~10 layouts an answer on these and shows a few."""
    states, host = _states_and_host(t, gpus, zero, offload)
    allocated = (sum(states) + (t["zero3_buffers"] if zero >= 3 and gpus >= 2 else 0.0) + t["quant_buffers"]
                 + t["activations"] + t["logits"])
    return (allocated + CUDA_CONTEXT_GB * GB + ALLOCATOR_MARGIN * allocated) / GB, host / GB


def _states_and_host(t: dict, gpus: int, zero: int, offload: str) -> tuple[list[float], float]:
    """(the model states' bytes per GPU, in ``STATE_KEYS``' order: frozen, trainable,
    gradients, fp32 master, optimizer, adapters; all the bytes the layout moves to host
    memory, the offloaded checkpoint inputs included)."""
    host = 0.0
    frozen = t["frozen_weights"]
    if offload == "all":
        host += frozen
        frozen_here = 0.0
    else:
        frozen_here = frozen / gpus if zero >= 3 else frozen
    states = [frozen_here, 0.0, 0.0, 0.0, 0.0, 0.0]
    for index, total, from_stage, offloaded_by in t["state_slots"]:
        if offload in offloaded_by:
            host += total
        else:
            states[index] += total / gpus if zero >= from_stage else total
    if t["host_checkpoint_inputs"] is not None:
        host += t["host_checkpoint_inputs"] * gpus
    return states, host


def _state_totals(job: Job, n_adapter: int) -> tuple:
    """(place in ``STATE_KEYS``, bytes over all cards, the ZeRO stage that shards them, the
    offload modes that move them to host memory) of each model state, in ``model_states``'
    order and arithmetic: what a layout divides or moves (``layout_bytes``)."""
    method = job.method
    if method in ADAM_STATE_BYTES:
        language_params = job.arch.language_params
        return tuple((_STATE_SLOT[name], b * language_params, SHARD_STAGE[name], OFFLOADED_BY[name])
                     for name, b in full_state_bytes_per_param(method).items())
    scale = job.stack.adapter_bytes / ADAPTER_WEIGHT_BYTES  # torchtune: bf16 adapters and moments
    adapters = _STATE_SLOT["adapters"]
    return ((adapters, n_adapter * (ADAPTER_WEIGHT_BYTES * scale), 3, ("all",)),
            (adapters, n_adapter * (ADAPTER_GRAD_BYTES * scale), 2, ("all",)),
            (adapters, n_adapter * (ADAPTER_ADAM_BYTES * scale), 1, ("optimizer", "all")))


_STATE_SLOT = {key: i for i, key in enumerate(STATE_KEYS)}


def with_warnings(e: Estimate, warnings: tuple[str, ...]) -> Estimate:
    """``dataclasses.replace(e, warnings=warnings)`` through the constructor (replace's
    per-field bookkeeping was a visible share of the recommendation's own estimate)."""
    return Estimate(e.model, e.method, e.params, e.gpus, e.zero, e.offload, e.per_gpu_gb, e.total_gb, e.host_ram_gb,
                    e.breakdown_gb, e.checkpoint_gb, e.adapter_params, e.train_flops, warnings, e.framework)
