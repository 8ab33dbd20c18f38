"""OpenAPI 3.1 path item for ``/api/v1/estimate`` (merged into ``/api/v1/schema``)."""

from .engine import DEFAULT_UTILISATION, LOSSES, METHODS, OFFLOADS
from .frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS
from .inputs import MAX_BATCH, MAX_EPOCHS, MAX_GPUS, MAX_PARAMS_B, MAX_RANK, MAX_SEQ, VENDORS
from .presets import PRESETS


def _param(name, schema, description):
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def _int(lo, hi, default=None):
    s = {"type": "integer", "minimum": lo, "maximum": hi}
    return s | ({"default": default} if default is not None else {})


_BOOL = {"type": "boolean"}

PARAMETERS = [
    _param("model", {"type": "string", "enum": list(PRESETS)},
           "Model preset. Give a preset, `params` or a config.json, not a preset and params."),
    _param("params", {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_PARAMS_B},
           "Parameter count in billions; a Llama-style shape is inferred."),
    _param("method", {"type": "string", "enum": list(METHODS), "default": "qlora"},
           "full (AdamW, 16 B/param), full-8bit (10 B/param), lora (bf16 base), "
           "qlora (NF4 base)."),
    _param("seq", _int(1, MAX_SEQ, 2048), "Sequence length in tokens."),
    _param("batch", _int(1, MAX_BATCH, 1), "Micro-batch size per GPU."),
    _param("checkpointing", _BOOL | {"default": True}, "Gradient checkpointing."),
    _param("flash_attention", _BOOL | {"default": True}, "FlashAttention (no s² scores)."),
    _param("lora_rank", _int(1, MAX_RANK, 16), "LoRA rank."),
    _param("lora_targets", {"type": "string", "default": "all"},
           "`all` or a comma-separated list such as `q_proj,v_proj`."),
    _param("gpus", _int(1, MAX_GPUS, 1), "Number of GPUs."),
    _param("zero", {"oneOf": [_int(0, 3, 0), {"type": "string", "enum": ["fsdp"]}]},
           "ZeRO stage 0–3 (`fsdp` = full shard = 3); needs gpus > 1."),
    _param("offload", {"type": "string", "enum": list(OFFLOADS), "default": "none"},
           "Offload optimizer states (zero ≥ 1) or everything (zero = 3) to host memory."),
    _param("tokens", {"type": "integer", "minimum": 0, "default": 0},
           "Training tokens per epoch, for the run-time estimate (6·N·D)."),
    _param("epochs", {"type": "number", "minimum": 0.01, "maximum": MAX_EPOCHS,
                      "default": 1}, "Epochs."),
    _param("utilisation", {"type": "number", "minimum": 0.01, "maximum": 1,
                           "default": DEFAULT_UTILISATION}, "Share of the dense bf16 peak a step keeps busy (sizing.throughput); the time range scales with it."),
    _param("framework", {"type": "string", "enum": list(FRAMEWORKS), "default": DEFAULT_FRAMEWORK},
           "Training stack whose memory terms apply: hf (Trainer/PEFT/TRL + bitsandbytes: unfused "
           "loss, fp32 non-4-bit weights, 4-bit input copies; the heaviest), axolotl (as hf), "
           "liger (fused loss), unsloth (fused loss, checkpoints in host RAM), torchtune (6 B/logit; "
           "the source tables' terms)."),
    _param("loss", {"type": "string", "enum": ["auto", *LOSSES], "default": "auto"},
           "Override the framework's loss: unfused 14 B/logit, standard 6 B/logit, fused (a chunk)."),
    _param("vendor", {"type": "string", "enum": list(VENDORS), "default": "cuda"},
           "`cuda` = NVIDIA only; `any` = ROCm (AMD) allowed."),
    _param("site", {"type": "string"}, "Only offers with a unit at this site code."),
    _param("in_stock", _BOOL | {"default": False}, "Only offers free right now."),
]

_GB_MAP = {"type": "object", "additionalProperties": {"type": "number"}}

RECOMMENDATION = {
    "type": "object",
    "required": ["offer", "gpu", "gpus", "vram_gb", "weekly_usd", "monthly_usd",
                 "per_gpu_hour_usd", "in_stock"],
    "properties": {
        "offer": {"type": "string"}, "offer_name": {"type": "string"},
        "gpu": {"type": "string"}, "gpus": {"type": "integer"}, "vram_gb": {"type": "integer"},
        "mode": {"type": "string", "enum": ["single", "data-parallel", "zero-3"]},
        "zero": {"type": "integer"}, "per_gpu_gb": {"type": "number"},
        "host_ram_gb": {"type": ["integer", "null"],
                        "description": "The instance's host RAM (null: not known yet); a plan's offload must fit it."},
        "offload": {"type": "string", "description": "What this plan moves to host RAM (none, optimizer, all)."},
        "weekly_usd": {"type": "number"}, "monthly_usd": {"type": "number"},
        "per_gpu_hour_usd": {"type": "number"}, "in_stock": {"type": "boolean"},
        "free_by_site": {"type": "object", "additionalProperties": {"type": "integer"}},
        "run_hours": {"type": ["number", "null"],
                      "description": "Wall-clock hours to train tokens × epochs on this offer (central figure)."},
        "run_hours_range": {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                            "description": "Likely hours, fastest and slowest (utilisation 0.25-0.75 of peak)."},
        "rental_cost_usd": {"type": ["number", "null"],
                            "description": "Cost to finish: the lease terms' whole weeks or months, whichever is less."},
        "rental_cost_range_usd": {"type": ["array", "null"], "items": {"type": "number"}, "minItems": 2,
                                  "maxItems": 2},
        "compute_cost_usd": {"type": ["number", "null"]},
        "tokens_per_s": {"type": ["integer", "null"], "description": "Training tokens per second, all its cards."},
        "tokens_per_s_per_gpu": {"type": ["integer", "null"]},
        "tokens_per_s_range": {"type": ["array", "null"], "items": {"type": "integer"}, "minItems": 2,
                               "maxItems": 2},
        "max_micro_batch": {"type": ["integer", "null"],
                            "description": "The largest micro-batch this offer's configuration fits (0: none)."},
        "reason": {"type": "string"}, "order_url": {"type": "string"},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
}

PLAN = {
    "type": ["object", "null"],
    "description": "The recommended plan (its cards, mode, ZeRO stage): the page's headline figures.",
    "properties": {"offer": {"type": "string"}, "mode": {"type": "string"},
                   "gpus": {"type": "integer"}, "zero": {"type": "integer"},
                   "offload": {"type": "string"}, "per_gpu_gb": {"type": "number"},
                   "total_gb": {"type": "number"}, "breakdown_gb": _GB_MAP},
}

ONE_CHANGE = {
    "type": "array",
    "description": "Cheaper plans that change one choice (vendor, qlora, optimizer-8bit, lora, offload), "
                   "cheapest first, each with its trade-off and the changed query.",
    "items": {"allOf": [RECOMMENDATION, {"type": "object", "properties": {
        "change": {"type": "string"}, "label": {"type": "string"}, "tradeoff": {"type": "string"},
        "query": {"type": "object"}}}]},
}

CHECKPOINTS = {
    "type": "object",
    "description": "Disk sizes in GB: resume_with_optimizer (trained weights + optimizer states; "
                   "for LoRA the adapter's, the frozen base is not in it), bf16_weights (whole "
                   "model in bf16, merged), adapter (LoRA adapter alone, fp32).",
    "additionalProperties": {"type": "number"},
}

ESTIMATE = {
    "type": "object",
    "required": ["per_gpu_gb", "total_gb", "host_ram_gb", "breakdown_gb", "checkpoint_gb",
                 "warnings", "recommendations", "advice"],
    "properties": {
        "model": {"type": "string"}, "method": {"type": "string"},
        "params": {"type": "integer"}, "gpus": {"type": "integer"},
        "per_gpu_gb": {"type": "number", "description": "As configured (gpus, zero, offload)."},
        "total_gb": {"type": "number"},
        "host_ram_gb": {"type": "number"}, "breakdown_gb": _GB_MAP, "checkpoint_gb": CHECKPOINTS,
        "framework": {"type": "string"}, "plan": PLAN, "one_change": ONE_CHANGE,
        "train_flops": {"type": "number"},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "recommendations": {"type": "array", "items": RECOMMENDATION,
                            "description": "Cheapest first, then alternatives."},
        "advice": {"type": "array", "items": {"type": "string"}},
    },
}

ERROR = {
    "type": "object", "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "field": {"type": "string"},
                   "message": {"type": "string"}},
}


def _json(schema, description):
    return {"description": description, "content": {"application/json": {"schema": schema}}}


RESPONSES = {
    "200": _json(ESTIMATE, "Estimate and recommendations"),
    "400": _json(ERROR, "Invalid input; `field` names the parameter"),
}

PATHS = {
    "/api/v1/estimate": {
        "summary": "VRAM estimate and the cheapest offer that runs the job",
        "parameters": PARAMETERS,
        "get": {"operationId": "estimate", "tags": ["sizing"], "responses": RESPONSES},
        "post": {
            "operationId": "estimateFromConfig", "tags": ["sizing"],
            "description": "Body: a Hugging Face config.json (at most 64 KB); the other "
                           "inputs as query parameters.",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"type": "object", "description": "Hugging Face config.json"}}}},
            "responses": RESPONSES | {"413": _json(ERROR, "Body larger than 64 KB")},
        },
    }
}
