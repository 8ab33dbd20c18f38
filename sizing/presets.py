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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the linear projections of a Llama-style decoder layer (LoRA / NF4 targets)
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Architecture:
    """Shape of a decoder-only transformer (what the memory formulas need).

    ``params_override`` pins the total parameter count (used when the user only gave
    ``params=N``: the model-state terms then use exactly N, the inferred shape only drives
    activations, logits and adapter sizes).
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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def module_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of one linear projection of a decoder layer."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }[module]

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the 7 projections of one layer: 2h² + 2h·kv + 3h·i."""
        return sum(a * b for a, b in map(self.module_shape, LINEAR_MODULES))

    @property
    def embedding_params(self) -> int:
        """embed_tokens (V·h) plus lm_head (V·h) unless tied."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def shape_params(self) -> int:
        """Total parameters computed from the shape (module docstring formula)."""
        bias = (self.hidden + 2 * self.kv_dim) if self.qkv_bias else 0
        per_layer = self.linear_params_per_layer + 2 * self.hidden + bias
        return self.layers * per_layer + self.embedding_params + self.hidden

    @property
    def params(self) -> int:
        """Total parameter count N (the override when the user gave only a count)."""
        return self.params_override if self.params_override else self.shape_params

    @property
    def quantisable_params(self) -> int:
        """Parameters that NF4 quantises: the decoder's linear layers only.

        bitsandbytes/transformers keep embeddings, lm_head (``llm_int8_skip_modules``),
        norms and biases in the compute dtype; with a pinned count the split keeps the
        same non-linear part, so ``params - quantisable`` is the bf16 remainder.
        """
        other = self.shape_params - self.layers * self.linear_params_per_layer
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
