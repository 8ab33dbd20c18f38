"""The estimate of one job: the engine's terms (``sizing.engine``) summed per GPU, with the
job's warnings (``sizing.job_warnings``, which read the same terms). Kept apart from the
terms so the warnings can import them without a circle."""

from __future__ import annotations

from .engine import (
    ADAM_STATE_BYTES,
    ALLOCATOR_MARGIN,
    BREAKDOWN_KEYS,
    CUDA_CONTEXT_GB,
    GB,
    Estimate,
    Job,
    activation_bytes,
    active_params,
    adapter_params,
    checkpoint_gb,
    checkpoint_input_bytes,
    logits_bytes,
    model_states,
    quant_buffer_bytes,
    sharding_buffer_bytes,
    train_flops,
)
from .job_warnings import job_warnings


def estimate(job: Job, *, warnings: bool = True) -> Estimate:
    """Peak GPU memory of one training step, per GPU and in total (all GPUs).
    ``warnings=False`` leaves out the job's warnings (``Estimate.warnings`` is empty): the
    recommender sizes each card's configuration of the job and reads the warnings of the
    job as configured only."""
    states, host = model_states(job)
    bd = dict(states)
    bd["sharding_buffers"] = sharding_buffer_bytes(job)
    bd["quant_buffers"] = quant_buffer_bytes(job)
    bd["activations"] = activation_bytes(job)
    bd["logits"] = logits_bytes(job.arch, job.seq, job.batch, job.loss_kind)
    if job.checkpointing and job.stack.offloads_checkpoints:
        host += checkpoint_input_bytes(job) * job.gpus
    allocated = sum(bd.values())
    bd["cuda_context"] = CUDA_CONTEXT_GB * GB
    bd["allocator_margin"] = ALLOCATOR_MARGIN * allocated
    per_gpu = sum(bd.values())
    n_adapter = 0 if job.method in ADAM_STATE_BYTES else adapter_params(
        job.arch, job.lora_rank, job.lora_targets)
    return Estimate(
        model=job.arch.name, method=job.method, params=job.arch.params, gpus=job.gpus,
        zero=job.zero, offload=job.offload, per_gpu_gb=per_gpu / GB,
        total_gb=per_gpu * job.gpus / GB, host_ram_gb=host / GB,
        breakdown_gb={k: bd[k] / GB for k in BREAKDOWN_KEYS},
        checkpoint_gb=checkpoint_gb(job, n_adapter), adapter_params=n_adapter,
        train_flops=train_flops(active_params(job.arch), job.tokens, job.epochs),
        warnings=tuple(job_warnings(job)) if warnings else (), framework=job.framework,
    )
