"""VRAM estimate for one fine-tuning job: every term is a named, documented formula.

Pure Python, no Django. Units: bytes internally, decimal GB (1 GB = 1e9 bytes) in the
output, as the SPEC's figures are. Terms, per GPU (see each function's docstring):

* model states — bytes/param by method (SPEC "VRAM rules"), divided over N cards by the
  ZeRO stage (Rajbhandari et al. 2020, SPEC's ZeRO table), or moved to host by offload;
* LoRA adapters — r·(in+out) per targeted projection, 16 B each (fp32 weight, grad, m, v);
* activations — Korthikanti et al. 2022 ("Reducing Activation Recomputation"), eq. 1;
* logits — by the framework's loss: s·b·V·14 (Hugging Face), ·6 (torchtune), or a chunk
  of s·b·h·6 (Liger, Unsloth: fused);
* the 4-bit path's buffers — the dequantised bf16 weight of the largest linear layer, and
  (bitsandbytes) the bf16 input every 4-bit linear keeps for backward;
* CUDA context + allocator margin (the SPEC's "runtime overhead included").

What differs between training stacks is in ``sizing.frameworks``; the default (``hf``:
Trainer/PEFT/TRL + bitsandbytes) is the heaviest of them, so it never under-sizes those.
Tokens per micro-batch = micro-batch × sequence length (with packing, the packed length).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, Framework
from .frozen import quick_init
from .presets import Architecture

GB = 1e9

# --- model-state bytes per parameter (SPEC "VRAM rules") ---------------------------------
#: bf16 weights / bf16 gradients / fp32 master copy (mixed-precision AdamW)
BF16_WEIGHT_BYTES = 2.0
BF16_GRAD_BYTES = 2.0
FP32_MASTER_BYTES = 4.0
#: Adam first + second moment: fp32 (4 + 4) or 8-bit bitsandbytes (1 + 1)
ADAM_STATE_BYTES = {"full": 8.0, "full-8bit": 2.0}

#: NF4 with double quantisation (Dettmers et al. 2023, QLoRA §3): 4-bit codes, one absmax
#: per 64 weights stored as 8 bits, plus one fp32 scale per 256 absmax values:
#: 4 + 8/64 + 32/(64·256) = 4.127 bits per parameter.
NF4_BITS_PER_PARAM = 4 + 8 / 64 + 32 / (64 * 256)
NF4_BYTES_PER_PARAM = NF4_BITS_PER_PARAM / 8

#: LoRA adapter parameter: fp32 weight 4 + fp32 grad 4 + Adam m 4 + v 4 (PEFT keeps adapters
#: in fp32 — ``autocast_adapter_dtype=True``)
ADAPTER_WEIGHT_BYTES = 4.0
ADAPTER_GRAD_BYTES = 4.0
ADAPTER_ADAM_BYTES = 8.0

# --- activations (Korthikanti et al. 2022, eq. 1; bf16, per transformer layer) ------------
#: sbh·(34 + 5·a·s/h): 34 bytes per token per hidden unit for LN, QKV, attention output and
#: MLP tensors, 5·a·s/h for the s×s score/softmax/dropout tensors (gone with FlashAttention,
#: which recomputes them blockwise).
KORTHIKANTI_SBH = 34.0
KORTHIKANTI_SCORES = 5.0
#: with full recomputation only each layer's bf16 input (2·s·b·h) is kept, plus one layer's
#: working set during its backward: the recomputed activations and their gradients (2×).
CHECKPOINT_INPUT_BYTES = 2.0
BACKWARD_WORKING_SET = 2.0

#: logits bytes per token per vocabulary entry, by loss implementation:
#: "standard": bf16 lm_head output 2 + one fp32 upcast for the cross-entropy 4 (torchtune's
#: chunked loss; the SPEC's tables reproduce with this); "unfused": Hugging Face's
#: causal-LM loss keeps the bf16 logits 2, the fp32 upcast 4, the shifted fp32 copy 4 and
#: the fp32 log-softmax saved for backward 4 = 14 (matches Unsloth's HF+FA2 measurements).
LOGITS_BYTES = {"standard": 2.0 + 4.0, "unfused": 2.0 + 4.0 + 4.0 + 4.0,
                "chunked": 2.0 + 4.0 / 8}
#: "chunked" (torchtune's ``CEWithChunkedOutputLoss``, ``num_output_chunks=8``): the bf16
#: logits of every chunk 2, and one chunk's fp32 upcast at a time, 4/8.
#: "fused" (Liger's fused linear cross-entropy, Unsloth): the logits exist one chunk at a
#: time; Liger sizes a chunk so it holds about as many logits as the hidden states have
#: values (≤ 2× after rounding to a power of two), bf16 2 + fp32 4 per value, per hidden unit.
FUSED_LOSS_BYTES_PER_HIDDEN = 2.0 + 4.0
LOSSES = (*LOGITS_BYTES, "fused")
#: Mention the loss implementation when switching it would change the peak by at least this.
LOSS_ADVICE_GB = 1.0

#: Fused layer kernels (Unsloth's LoRA MLP/QKV kernels, fused RMSNorm and RoPE; or
#: torch.compile, whose partitioner recomputes pointwise ops in backward): a layer keeps only
#: the bf16 inputs and outputs of its matmuls — both norms' inputs (2h), Q, K, V (q + 2kv),
#: the attention output (q) and the MLP's gate and up outputs (2 × width); the SwiGLU
#: product and every elementwise intermediate are recomputed. Per token, 2 B each.
FUSED_LAYER_BYTES = 2.0

# --- the 4-bit path ----------------------------------------------------------------------
#: bitsandbytes dequantises a 4-bit weight to bf16 for each matmul: the largest linear
#: layer's bf16 copy is the transient peak (one layer at a time).
DEQUANT_WEIGHT_BYTES = 2.0
#: MatMul4Bit keeps the bf16 input of every 4-bit linear for backward: 2 B per input
#: feature per token, for every linear a token runs through (q, k, v, o, gate, up, down;
#: routed experts by num_experts_per_tok). With checkpointing only the layer being
#: recomputed holds them.
SAVED_4BIT_INPUT_BYTES = 2.0
#: PEFT's prepare_model_for_kbit_training upcasts non-4-bit parameters to fp32.
FP32_BYTES = 4.0

# --- mixture of experts --------------------------------------------------------------------
#: Korthikanti's 34 = 15 (attention, norms) + 19 (MLP) per s·b·h for a dense MLP; a
#: routed MLP's activations scale with the width a token runs through (k experts + shared)
#: relative to a dense SwiGLU of the same parameter budget, 8h/3.
KORTHIKANTI_NON_MLP = 15.0
KORTHIKANTI_MLP = 19.0
DENSE_SWIGLU_WIDTH = 8 / 3

# --- runtime overhead (SPEC: "figures include runtime overhead") -------------------------
#: CUDA context + cuBLAS/cuDNN/NCCL workspaces per GPU process (0.5–1 GB on Ampere/Hopper;
#: we take the top of the range)
CUDA_CONTEXT_GB = 1.0
#: PyTorch caching-allocator fragmentation: reserved exceeds allocated by ~10% at peak
#: (second document: "fragmentation margin included")
ALLOCATOR_MARGIN = 0.10

# --- training time -------------------------------------------------------------------------
#: training FLOPs = 6·N·D (Kaplan et al. 2020): 2 forward + 4 backward per parameter-token
FLOPS_PER_PARAM_TOKEN = 6.0
#: share of a card's dense bf16 peak a step keeps busy, counted on the hardware FLOPs of
#: ``sizing.throughput`` (recomputation and attention included); its calibration: CALIBRATION.md
DEFAULT_UTILISATION = 0.40

METHODS = ("full", "full-8bit", "lora", "qlora")
OFFLOADS = ("none", "optimizer", "all")
MAX_NODE_GPUS = 8

BREAKDOWN_KEYS = (
    "frozen_weights", "trainable_weights", "gradients", "fp32_master", "optimizer_states",
    "adapters", "sharding_buffers", "quant_buffers", "activations", "logits", "cuda_context",
    "allocator_margin",
)


@quick_init  # one or more per answer (sizing.frozen)
@dataclass(frozen=True, slots=True)
class Job:
    """What the engine needs (``sizing.inputs.parse_request`` builds it from user input)."""

    arch: Architecture
    method: str = "qlora"
    seq: int = 2048
    batch: int = 1
    checkpointing: bool = True
    flash_attention: bool = True
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    gpus: int = 1
    zero: int = 0
    offload: str = "none"
    tokens: int = 0
    epochs: float = 1.0
    utilisation: float = DEFAULT_UTILISATION
    framework: str = DEFAULT_FRAMEWORK
    loss: str = "auto"  # "auto": the framework's own loss; else a key of LOSSES

    @property
    def stack(self) -> Framework:
        return FRAMEWORKS[self.framework]

    @property
    def loss_kind(self) -> str:
        return self.stack.loss if self.loss == "auto" else self.loss

    @property
    def tokens_per_micro_batch(self) -> int:
        """What activations and logits scale with: micro-batch × sequence length."""
        return self.seq * self.batch

    def laid_out(self, gpus: int, zero: int, offload: str, method: str) -> Job:
        """``dataclasses.replace(self, gpus=…, zero=…, offload=…, method=…)``: the same job on
        another layout (the recommender sizes one per card count it meets), through the
        constructor, positionally (replace's per-field bookkeeping and keywords cost more)."""
        return Job(self.arch, method, self.seq, self.batch, self.checkpointing, self.flash_attention,
                   self.lora_rank, self.lora_targets, gpus, zero, offload, self.tokens, self.epochs,
                   self.utilisation, self.framework, self.loss)


#: the fields ``laid_out`` passes in their order (tests/sizing/test_fast_paths.py holds the two alike)
_LAID_OUT_ORDER = ("arch", "method", "seq", "batch", "checkpointing", "flash_attention", "lora_rank", "lora_targets",
                   "gpus", "zero", "offload", "tokens", "epochs", "utilisation", "framework", "loss")


@quick_init  # built by the dozen per answer (sizing.frozen)
@dataclass(frozen=True, slots=True)
class Estimate:
    """Result of :func:`estimate`. GB are decimal (1e9 bytes)."""

    model: str
    method: str
    params: int
    gpus: int
    zero: int
    offload: str
    per_gpu_gb: float
    total_gb: float
    host_ram_gb: float
    breakdown_gb: dict[str, float]
    checkpoint_gb: dict[str, float]
    adapter_params: int
    train_flops: float
    warnings: tuple[str, ...] = field(default=())
    framework: str = DEFAULT_FRAMEWORK

    @property
    def model_state_gb(self) -> float:
        """Per-GPU model states (weights, grads, master, optimizer, adapters)."""
        keys = ("frozen_weights", "trainable_weights", "gradients", "fp32_master",
                "optimizer_states", "adapters")
        return sum(self.breakdown_gb[k] for k in keys)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        d["model_state_gb"] = self.model_state_gb
        return d


# --- model states ----------------------------------------------------------------------------

def _shard(nbytes: float, stage: int, from_stage: int, gpus: int) -> float:
    """ZeRO: a state is split over the N cards once the stage reaches the one that shards it
    (optimizer states + fp32 master: stage 1; gradients: 2; parameters: 3)."""
    return nbytes / gpus if stage >= from_stage else nbytes


def full_state_bytes_per_param(method: str) -> dict[str, float]:
    """Per-parameter model states of a full fine-tune (SPEC: 2 + 2 + 4 + 4 + 4 = 16 B;
    8-bit optimizer: 2 + 2 + 4 + 1 + 1 = 10 B)."""
    return {
        "trainable_weights": BF16_WEIGHT_BYTES,
        "gradients": BF16_GRAD_BYTES,
        "fp32_master": FP32_MASTER_BYTES,
        "optimizer_states": ADAM_STATE_BYTES[method],
    }


#: which ZeRO stage shards each state, and which offload mode moves it to host memory
SHARD_STAGE = {"trainable_weights": 3, "frozen_weights": 3, "gradients": 2,
                "fp32_master": 1, "optimizer_states": 1}
OFFLOADED_BY = {"fp32_master": ("optimizer", "all"), "optimizer_states": ("optimizer", "all"),
                 "trainable_weights": ("all",), "frozen_weights": ("all",),
                 "gradients": ("all",)}


def zero_bytes_per_param(method: str, stage: int, gpus: int, offload: str = "none") -> float:
    """Per-card model-state bytes per parameter of a full fine-tune (SPEC's ZeRO table):

    ZeRO-0 16; ZeRO-1 4 + 12/N; ZeRO-2 2 + 14/N; ZeRO-3 16/N; ZeRO-3 + optimizer offload
    4/N (master and moments live in host memory). 8-bit optimizer: replace 12 by 6.
    """
    total = 0.0
    for name, b in full_state_bytes_per_param(method).items():
        if offload in OFFLOADED_BY[name]:
            continue
        total += _shard(b, stage, SHARD_STAGE[name], gpus)
    return total


def adapter_params(arch: Architecture, rank: int, targets: tuple[str, ...]) -> int:
    """LoRA (Hu et al. 2021): A (r×in) + B (out×r) per targeted projection, layer and
    expert (PEFT's all-linear puts an adapter on every expert of a mixture). The sum of
    the targets' in + out is a count of the model, kept on it per set of targets."""
    key = ("adapter_io", tuple(targets))
    io = arch._derived.get(key)  # a new set of targets is no KeyError raised and caught
    if io is None:
        io = arch._derived[key] = sum(arch.module_io(t) for t in targets)
    return rank * io  # integers: the same as the sum of rank × (in + out)


def frozen_weight_bytes(arch: Architecture, method: str, upcast: bool = False) -> float:
    """Frozen weights: the whole model in bf16 (LoRA); QLoRA: NF4 (4.127 bits) for the
    decoder's linear layers, the rest (embeddings, lm_head, norms) in bf16 — or fp32 when
    the stack ``upcast``s them (PEFT's prepare_model_for_kbit_training); a full fine-tune
    freezes only a vision tower (bf16)."""
    vision = arch.vision_params * BF16_WEIGHT_BYTES
    if method == "lora":
        return arch.params * BF16_WEIGHT_BYTES
    if method == "qlora":
        q = arch.quantisable_params
        rest = arch.params - q - arch.vision_params
        return q * NF4_BYTES_PER_PARAM + rest * (FP32_BYTES if upcast else BF16_WEIGHT_BYTES) + vision
    return vision


STATE_KEYS = ("frozen_weights", "trainable_weights", "gradients", "fp32_master", "optimizer_states", "adapters")


def model_states(job: Job, frozen: float | None = None, adapters: int | None = None,
                 layout: tuple[int, int, str, str] | None = None) -> tuple[dict[str, float], float]:
    """Per-GPU model-state bytes by breakdown key, and bytes moved to host RAM (total).
    ``frozen`` and ``adapters``: the job's ``frozen_weight_bytes`` (with its stack's upcast)
    and ``adapter_params``, when already known (no layout changes them). ``layout``: (gpus,
    zero, offload, method) in place of the job's own, as ``job.laid_out(*layout)`` would
    give (the recommender sizes one job in many layouts; no copy of it per layout)."""
    n, stage, off, method = (job.gpus, job.zero, job.offload, job.method) if layout is None else layout
    out = dict.fromkeys(STATE_KEYS, 0.0)
    host = 0.0
    if frozen is None:
        frozen = frozen_weight_bytes(job.arch, method, job.stack.upcast_unquantised)
    if off == "all":
        host += frozen
    else:
        out["frozen_weights"] = _shard(frozen, stage, 3, n)
    if method in ADAM_STATE_BYTES:
        language_params = job.arch.language_params
        for name, b in full_state_bytes_per_param(method).items():
            total = b * language_params
            if off in OFFLOADED_BY[name]:
                host += total
            else:
                out[name] = _shard(total, stage, SHARD_STAGE[name], n)
        return out, host
    a = adapter_params(job.arch, job.lora_rank, job.lora_targets) if adapters is None else adapters
    scale = job.stack.adapter_bytes / ADAPTER_WEIGHT_BYTES  # torchtune: bf16 adapters and moments
    parts = ((ADAPTER_WEIGHT_BYTES * scale, 3, ("all",)), (ADAPTER_GRAD_BYTES * scale, 2, ("all",)),
             (ADAPTER_ADAM_BYTES * scale, 1, ("optimizer", "all")))
    for b, from_stage, offloaded in parts:
        if off in offloaded:
            host += a * b
        else:
            out["adapters"] += _shard(a * b, stage, from_stage, n)
    return out, host


def sharding_buffer_bytes(job: Job, layout: tuple[int, int, str, str] | None = None) -> float:
    """ZeRO-3/FSDP all-gather buffers: the current and the prefetched layer's full weights
    (2 layers × params/layer × weight bytes) are materialised on every card. ``layout`` as
    in ``model_states``."""
    gpus, zero, _, method = (job.gpus, job.zero, job.offload, job.method) if layout is None else layout
    if zero < 3 or gpus < 2:
        return 0.0
    per_param = BF16_WEIGHT_BYTES if method in ADAM_STATE_BYTES else (
        frozen_weight_bytes(job.arch, method) / job.arch.params)
    return 2 * per_param * job.arch.params / job.arch.layers


def quant_buffer_bytes(job: Job) -> float:
    """4-bit path: the bf16 copy of the largest linear layer, dequantised for its matmul."""
    if job.method != "qlora":
        return 0.0
    return DEQUANT_WEIGHT_BYTES * job.arch.largest_linear


# --- activations and logits -----------------------------------------------------------------

def layer_factor(arch: Architecture) -> float:
    """Korthikanti's bytes per s·b·h of one layer without the s² scores: 34 for a dense MLP;
    a mixture of experts scales the MLP's 19 by the width a token runs through."""
    if not arch.moe:
        return KORTHIKANTI_SBH
    width = arch.active_mlp_width() / (DENSE_SWIGLU_WIDTH * arch.hidden)
    return KORTHIKANTI_NON_MLP + KORTHIKANTI_MLP * width


def layer_activation_bytes(arch: Architecture, seq: int, batch: int, flash: bool) -> float:
    """Korthikanti et al. 2022, eq. 1: s·b·h·(34 + 5·a·s/h) bytes per layer (bf16).

    FlashAttention (Dao 2022) never stores the s×s scores: the 5·a·s²·b term disappears.
    """
    sbh = seq * batch * arch.hidden
    scores = 0.0 if flash else KORTHIKANTI_SCORES * arch.heads * seq * seq * batch
    return layer_factor(arch) * sbh + scores


def fused_layer_activation_bytes(arch: Architecture, seq: int, batch: int, flash: bool) -> float:
    """One layer's activations with fused kernels (``FUSED_LAYER_BYTES``): per token
    2 B × (2h + 2q + 2kv + 2·MLP width), q = heads × head_dim, kv = the K/V width; the s²
    scores as in Korthikanti when attention is not flash."""
    q = arch.heads * arch.head_dim
    width = 2 * arch.hidden + 2 * q + 2 * arch.kv_dim + 2 * arch.active_mlp_width()
    scores = 0.0 if flash else KORTHIKANTI_SCORES * arch.heads * seq * seq * batch
    return FUSED_LAYER_BYTES * seq * batch * width + scores


def saved_4bit_input_bytes(job: Job) -> float:
    """bitsandbytes keeps every 4-bit linear's bf16 input for backward: per layer,
    2 B × Σ in_features × tokens; all layers without checkpointing, one layer with it."""
    if job.method != "qlora" or not job.stack.saves_4bit_inputs:
        return 0.0
    per_layer = SAVED_4BIT_INPUT_BYTES * job.arch.active_linear_inputs() * job.tokens_per_micro_batch
    return per_layer if job.checkpointing else per_layer * job.arch.layers


def checkpoint_input_bytes(job: Job) -> float:
    """With checkpointing: each layer's bf16 input (2·s·b·h), L + 1 of them."""
    a = job.arch
    return CHECKPOINT_INPUT_BYTES * job.tokens_per_micro_batch * a.hidden * (a.layers + 1)


def activation_bytes(job: Job) -> float:
    """Activations held on the GPU at the peak of one micro-batch.

    Without recomputation: L × per-layer activations. With full activation checkpointing
    (Chen et al. 2016; Korthikanti §4): only each layer's input 2·s·b·h is kept, L times
    (in host RAM with Unsloth's offloaded checkpointing), plus one layer's working set
    while it is recomputed and back-propagated (``BACKWARD_WORKING_SET`` × per-layer
    activations). The 4-bit path adds its saved inputs (``saved_4bit_input_bytes``).
    """
    a = job.arch
    layer = fused_layer_activation_bytes if job.stack.fused_layers else layer_activation_bytes
    per_layer = layer(a, job.seq, job.batch, job.flash_attention)
    extra = saved_4bit_input_bytes(job)
    if not job.checkpointing:
        return a.layers * per_layer + extra
    inputs = 0.0 if job.stack.offloads_checkpoints else checkpoint_input_bytes(job)
    return inputs + BACKWARD_WORKING_SET * per_layer + extra


def logits_bytes(arch: Architecture, seq: int, batch: int, loss: str = "standard") -> float:
    """Logits for the loss: s·b·V·14 ("unfused"), s·b·V·6 ("standard"), or one chunk of
    about s·b·h values at 6 B ("fused"). Dominant for 128k–152k vocabularies."""
    if loss == "fused":
        return seq * batch * arch.hidden * FUSED_LOSS_BYTES_PER_HIDDEN
    return seq * batch * arch.vocab * LOGITS_BYTES[loss]


# --- checkpoints, time ---------------------------------------------------------------------

def checkpoint_gb(job: Job, n_adapter: int) -> dict[str, float]:
    """Disk sizes, each named for what it holds:

    * ``resume_with_optimizer`` — what resuming training needs: the trained weights with
      their optimizer states (full: bf16 + fp32 master + moments, 16 B/param, SPEC: 32B ≈
      512 GB; 10 B with an 8-bit optimizer; LoRA: the adapter + its states, 16 B/adapter
      param — the frozen base is not in it);
    * ``bf16_weights`` — the whole model in bf16 (a full fine-tune's result, or a LoRA
      merged into its base): 2 B/param;
    * ``adapter`` — a LoRA adapter alone, fp32 (4 B/adapter param).
    """
    n = job.arch.params
    if job.method in ADAM_STATE_BYTES:
        resume = sum(full_state_bytes_per_param(job.method).values()) * job.arch.language_params
        adapter = 0.0
    else:
        resume = (ADAPTER_WEIGHT_BYTES + ADAPTER_GRAD_BYTES + ADAPTER_ADAM_BYTES) * n_adapter
        adapter = ADAPTER_WEIGHT_BYTES * n_adapter
    return {"resume_with_optimizer": resume / GB, "bf16_weights": BF16_WEIGHT_BYTES * n / GB,
            "adapter": adapter / GB}


def train_flops(params: int, tokens: int, epochs: float) -> float:
    """Training compute ≈ 6·N·D (Kaplan et al. 2020), D = tokens × epochs."""
    return FLOPS_PER_PARAM_TOKEN * params * tokens * epochs


def train_hours(flops: float, gpus: int, tflops_per_gpu: float,
                utilisation: float = DEFAULT_UTILISATION) -> float:
    """Wall time = FLOPs / (gpus × dense bf16 TFLOPS × 1e12 × utilisation) / 3600."""
    rate = gpus * tflops_per_gpu * 1e12 * utilisation
    return flops / rate / 3600 if rate > 0 else float("inf")


def active_params(arch: Architecture) -> int:
    """Parameters one token runs through (a mixture of experts: k of E experts)."""
    if not arch.moe:
        return arch.params
    m = arch.moe
    idle = (m.experts - m.per_token) * 3 * arch.hidden * m.intermediate * arch.moe_layers
    return arch.params - idle
