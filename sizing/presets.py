"""Model architectures: presets with real numbers, Llama-style shape inference, HF config.json.

Pure Python, no Django. Every parameter count is derived from the shape:

    decoder layer (Llama / Mistral / Qwen2 / Yi family, SwiGLU MLP, GQA, RMSNorm):
        attention  = h*h (q) + 2*h*kv (k, v) + h*h (o)          [+ q/k/v biases for Qwen2]
        mlp        = 3*h*i (gate, up, down)
        norms      = 2*h
    model = layers * layer + V*h (embed_tokens) + V*h (lm_head, unless tied) + h (final norm)

with kv = num_key_value_heads * head_dim and head_dim = h / num_attention_heads.
These reproduce the published sizes: Llama-2-7B 6.74e9, Llama-2-70B 68.98e9, Llama-3-8B
8.03e9, Qwen2.5-7B 7.62e9, Qwen2.5-72B 72.7e9, Yi-34B 34.4e9, CodeLlama-34B 33.7e9.
Mixture-of-experts layers hold every expert's gate/up/down (plus shared experts and a
router h·E): Mixtral-8x7B 46.7e9, Qwen1.5-MoE-A2.7B 14.3e9, DeepSeek-V2-Lite 15.7e9 (with
its latent attention, ``MLA``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: the linear projections of a Llama-style decoder layer (LoRA / NF4 targets)
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


_MISSING = object()


def _memo(fn):
    """Memoise a derived figure on the (immutable) architecture: sizing one request asks
    for the parameter counts hundreds of times, across every candidate card."""
    name = fn.__name__

    def cached(self, *args):
        key = (name, *args) if args else name
        value = self._derived.get(key, _MISSING)  # a first use is no KeyError raised and caught
        if value is _MISSING:
            value = self._derived[key] = fn(self, *args)
        return value

    cached.__doc__ = fn.__doc__
    return cached


@dataclass(frozen=True, slots=True)
class MoE:
    """Mixture-of-experts MLP (Mixtral, Qwen-MoE, DeepSeek-MoE): every expert's weights are
    resident; each token runs through ``per_token`` routed experts plus the shared ones.

    ``shared_intermediate`` is the total width of the always-on shared experts (0: none);
    the first ``dense_layers`` layers keep a dense MLP of the model's ``intermediate``.
    """

    experts: int
    per_token: int
    intermediate: int
    shared_intermediate: int = 0
    dense_layers: int = 0


@dataclass(frozen=True, slots=True)
class MLA:
    """DeepSeek-V2 multi-head latent attention: low-rank KV (and optionally Q) projections.

    LoRA target names map onto its projections: ``q_proj`` (or ``q_a_proj`` + ``q_b_proj``),
    ``k_proj`` = ``kv_a_proj_with_mqa``, ``v_proj`` = ``kv_b_proj``, ``o_proj``.
    """

    kv_rank: int
    q_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """``rope_scaling`` of a config: the type, its factor and the pre-training context."""

    kind: str
    factor: float
    original_context: int


@dataclass(frozen=True, slots=True)
class Architecture:
    """Shape of a decoder-only transformer (what the memory formulas need).

    ``params_override`` pins the total parameter count (used when the user only gave
    ``params=N``: the model-state terms then use exactly N, the inferred shape only drives
    activations, logits and adapter sizes). ``vision_params`` is a vision tower (kept
    frozen in bf16 whatever the method); ``moe``/``mla``/``rope`` describe the families
    that need them.
    """

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tie_embeddings: bool = False
    max_context: int = 4096
    qkv_bias: bool = False
    params_override: int | None = None
    moe: MoE | None = None
    mla: MLA | None = None
    rope: RopeScaling | None = None
    vision_params: int = 0
    head_dim_override: int | None = None
    _derived: dict = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "_derived", {})

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    # --- linear layers ---------------------------------------------------------------------

    def _attention_shapes(self, module: str) -> list[tuple[int, int]]:
        h, q = self.hidden, self.heads * self.head_dim
        if self.mla is None:
            return {"q_proj": [(h, q)], "k_proj": [(h, self.kv_dim)],
                    "v_proj": [(h, self.kv_dim)], "o_proj": [(q, h)]}[module]
        m, n = self.mla, self.heads
        q_out = n * (m.nope_dim + m.rope_dim)
        return {
            "q_proj": [(h, m.q_rank), (m.q_rank, q_out)] if m.q_rank else [(h, q_out)],
            "k_proj": [(h, m.kv_rank + m.rope_dim)],
            "v_proj": [(m.kv_rank, n * (m.nope_dim + m.v_dim))],
            "o_proj": [(n * m.v_dim, h)],
        }[module]

    def _mlp_shapes(self, module: str, width: int) -> tuple[int, int]:
        h = self.hidden
        return (width, h) if module == "down_proj" else (h, width)

    def layer_shapes(self, module: str, moe_layer: bool) -> list[tuple[int, int]]:
        """(in_features, out_features) of every linear layer ``module`` names in one layer
        (one per expert in a mixture-of-experts layer)."""
        if module in ("q_proj", "k_proj", "v_proj", "o_proj"):
            return self._attention_shapes(module)
        if not moe_layer:
            return [self._mlp_shapes(module, self.intermediate)]
        m = self.moe
        shapes = [self._mlp_shapes(module, m.intermediate)] * m.experts
        if m.shared_intermediate:
            shapes.append(self._mlp_shapes(module, m.shared_intermediate))
        return shapes

    @property
    def moe_layers(self) -> int:
        return self.layers - self.moe.dense_layers if self.moe else 0

    def _per_layer_kinds(self) -> tuple[tuple[bool, int], ...]:
        """(is a mixture-of-experts layer, how many such layers)."""
        return ((False, self.layers - self.moe_layers), (True, self.moe_layers))

    @_memo
    def module_params(self, module: str) -> int:
        """Weights of ``module`` summed over all layers (and experts)."""
        return sum(n * sum(a * b for a, b in self.layer_shapes(module, moe))
                   for moe, n in self._per_layer_kinds() if n)

    @_memo
    def module_io(self, module: str) -> int:
        """Σ (in + out) of ``module`` over all layers and experts (LoRA: r·(in+out) each)."""
        return sum(n * sum(a + b for a, b in self.layer_shapes(module, moe))
                   for moe, n in self._per_layer_kinds() if n)

    def module_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a dense layer's projection (first if several)."""
        return self.layer_shapes(module, False)[0]

    @property
    @_memo
    def linear_params(self) -> int:
        """Weights of every decoder linear layer (all experts included)."""
        return sum(self.module_params(m) for m in LINEAR_MODULES)

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the 7 projections of one dense layer: 2h² + 2h·kv + 3h·i."""
        return sum(a * b for m in LINEAR_MODULES for a, b in self.layer_shapes(m, False))

    @property
    @_memo
    def largest_linear(self) -> int:
        """Weights of the largest single linear layer (one expert's, in an MoE)."""
        return max(a * b for m in LINEAR_MODULES for moe, n in self._per_layer_kinds() if n
                   for a, b in self.layer_shapes(m, moe))

    @_memo
    def active_linear_inputs(self) -> float:
        """Σ in_features of the linear layers one token runs through in one layer (routed
        experts by ``per_token``; the first ``dense_layers`` averaged in)."""
        def per_layer(moe: bool) -> float:
            total = 0.0
            for m in LINEAR_MODULES:
                shapes = self.layer_shapes(m, moe)
                if moe and m in ("gate_proj", "up_proj", "down_proj"):
                    routed = shapes[: self.moe.experts]
                    total += self.moe.per_token * routed[0][0]
                    total += sum(a for a, _ in shapes[self.moe.experts:])
                else:
                    total += sum(a for a, _ in shapes)
            return total
        return sum(n * per_layer(moe) for moe, n in self._per_layer_kinds() if n) / self.layers

    @_memo
    def active_mlp_width(self) -> float:
        """FFN width one token runs through, averaged over layers (k experts + shared)."""
        if not self.moe:
            return float(self.intermediate)
        m = self.moe
        moe_width = m.per_token * m.intermediate + m.shared_intermediate
        return (m.dense_layers * self.intermediate + self.moe_layers * moe_width) / self.layers

    # --- parameter counts ----------------------------------------------------------------

    @property
    def embedding_params(self) -> int:
        """embed_tokens (V·h) plus lm_head (V·h) unless tied."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    @_memo
    def _small_params(self) -> int:
        """Norms, biases, routers and MLA's latent norms (never quantised)."""
        h = self.hidden
        per_layer = 2 * h + ((h + 2 * self.kv_dim) if self.qkv_bias else 0)
        if self.mla:
            per_layer += self.mla.kv_rank + self.mla.q_rank
        router = self.moe_layers * h * (self.moe.experts + (1 if self.moe.shared_intermediate else 0)) if self.moe else 0
        return self.layers * per_layer + router + h

    @property
    @_memo
    def shape_params(self) -> int:
        """Total parameters computed from the shape (module docstring formula), vision
        tower included."""
        return self.linear_params + self._small_params + self.embedding_params + self.vision_params

    @property
    def params(self) -> int:
        """Total parameter count N (the override when the user gave only a count). Kept in
        ``_derived`` by hand: read a dozen times per answer, one frame instead of three."""
        value = self._derived.get("params")
        if value is None:
            value = self._derived["params"] = self.params_override if self.params_override else self.shape_params
        return value

    @property
    def language_params(self) -> int:
        """Parameters of the language model (what a full fine-tune trains)."""
        return self.params - self.vision_params

    @property
    @_memo
    def quantisable_params(self) -> int:
        """Parameters that NF4 quantises: the decoder's linear layers only.

        bitsandbytes/transformers keep embeddings, lm_head (``llm_int8_skip_modules``),
        norms, biases and routers in the compute dtype, and we keep a vision tower in bf16;
        with a pinned count the split keeps the same non-linear part, so
        ``params - quantisable`` is the bf16 remainder.
        """
        other = self.shape_params - self.linear_params
        return max(self.params - other, 0)


def _p(name, h, i, n_layers, heads, kv, vocab, ctx, tie=False, bias=False) -> Architecture:
    return Architecture(name, h, i, n_layers, heads, kv, vocab, tie, ctx, bias)


#: Real architectures (values from each model's config.json on the Hugging Face Hub).
PRESETS: dict[str, Architecture] = {
    a.name: a
    for a in (
        _p("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 4096),
        _p("llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 4096),
        _p("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096),
        _p("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192),
        _p("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128256, 131072),
        _p("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 8192),
        _p("mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768),
        _p("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, 32768, tie=True, bias=True),
        _p("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 151936, 32768, tie=True, bias=True),
        _p("qwen2.5-3b", 2048, 11008, 36, 16, 2, 151936, 32768, tie=True, bias=True),
        _p("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 131072, bias=True),
        _p("qwen2.5-14b", 5120, 13824, 48, 40, 8, 152064, 131072, bias=True),
        _p("qwen2.5-32b", 5120, 27648, 64, 40, 8, 152064, 131072, bias=True),
        _p("qwen2.5-72b", 8192, 29568, 80, 64, 8, 152064, 131072, bias=True),
        _p("yi-34b", 7168, 20480, 60, 56, 8, 64000, 4096),
        _p("codellama-34b", 8192, 22016, 48, 64, 8, 32000, 16384),
        _p("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128256, 131072),
        Architecture("mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, max_context=32768,
                     moe=MoE(experts=8, per_token=2, intermediate=14336)),
        Architecture("qwen1.5-moe-a2.7b", 2048, 5632, 24, 16, 16, 151936, max_context=8192,
                     qkv_bias=True, moe=MoE(experts=60, per_token=4, intermediate=1408,
                                            shared_intermediate=5632)),
        Architecture("deepseek-v2-lite", 2048, 10944, 27, 16, 16, 102400, max_context=163840,
                     moe=MoE(experts=64, per_token=6, intermediate=1408,
                             shared_intermediate=2 * 1408, dense_layers=1),
                     mla=MLA(kv_rank=512, q_rank=0, nope_dim=128, rope_dim=64, v_dim=128),
                     rope=RopeScaling("yarn", 40.0, 4096)),
    )
}

#: Llama-style inference constants (Touvron et al. 2023): head_dim 128, depth ≈ hidden/128,
#: SwiGLU intermediate = 8/3·h rounded up to a multiple of 256, vocabulary 32,000.
INFER_HEAD_DIM = 128
INFER_VOCAB = 32000
INFER_MULTIPLE_OF = 256


def _llama_intermediate(hidden: int) -> int:
    """SwiGLU width: ceil(8/3·h / 256)·256 (Llama's ``multiple_of`` rule: 4096 → 11008)."""
    return INFER_MULTIPLE_OF * math.ceil(8 * hidden / 3 / INFER_MULTIPLE_OF)


def infer_llama_shape(params: int) -> Architecture:
    """A plausible Llama-2-style shape for ``params`` parameters (MHA, untied, V=32000).

    Per layer 4h² + 3h·i ≈ 12h²; depth L ≈ h/128, so N ≈ 12h³/128 + 2Vh. Solve for h
    (rounded to a multiple of 128, so heads = h/128), then pick L to match N. The
    returned architecture pins ``params_override = params``.
    """
    target = max(int(params), 1)
    lo, hi = 128.0, 131072.0
    for _ in range(60):  # bisection on the monotone N(h)
        mid = (lo + hi) / 2
        if 12 * mid**3 / INFER_HEAD_DIM + 2 * INFER_VOCAB * mid < target:
            lo = mid
        else:
            hi = mid
    hidden = max(INFER_HEAD_DIM, INFER_HEAD_DIM * round(lo / INFER_HEAD_DIM))
    inter = _llama_intermediate(hidden)
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((target - 2 * INFER_VOCAB * hidden) / per_layer))
    heads = hidden // INFER_HEAD_DIM
    name = f"llama-style-{target / 1e9:g}b"
    return Architecture(name, hidden, inter, layers, heads, heads, INFER_VOCAB, False,
                        4096, False, target)
