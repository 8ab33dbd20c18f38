"""A pasted Hugging Face ``config.json`` → :class:`Architecture` (pure Python, no Django
models): Llama/Mistral/Qwen2-style dense models, mixtures of experts (Mixtral, Qwen-MoE,
DeepSeek-V2 with latent attention), vision-language wrappers (LLaVA-style ``text_config`` +
``vision_config``, Qwen2-VL's top-level text fields + ``vision_config``) and ``rope_scaling``.

Every rejection is a :class:`SizingInputError` naming the field (``config.<key>``), which
the API answers with a 400 and the page shows next to the config box.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from django.utils.translation import gettext

from .errors import SizingInputError
from .presets import MLA, Architecture, MoE, RopeScaling

MAX_PARAMS_B = 2000.0
MAX_SEQ = 1_048_576
MAX_VOCAB = 10_000_000
MAX_HIDDEN = 1_000_000
MAX_LAYERS = 10_000
MAX_EXPERTS = 4096

#: transformers' defaults for the fields a wrapped ``text_config`` may leave out
#: (``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config`` class defaults).
FAMILY_DEFAULTS = {
    "llama": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "vocab_size": 32000, "max_position_embeddings": 2048},
    "mistral": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "max_position_embeddings": 32768},
    "qwen2": {"hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 151936,
              "max_position_embeddings": 32768},
}
#: families whose attention carries q/k/v biases
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl")
#: model_type values we know to be something other than a causal decoder we can size
#: RoPE scaling types that stretch positions past the pre-training context at load time
#: (Llama 3.1's "llama3" and Qwen2-VL's "mrope" describe how the model was trained).
STRETCHING_ROPE = ("linear", "dynamic", "yarn", "longrope", "su")
UNSUPPORTED_TYPES = ("t5", "mt5", "bart", "whisper", "bert", "roberta", "clip", "siglip",
                     "mamba", "mamba2", "rwkv", "jamba", "falcon_mamba")


def _err(key: str, message) -> SizingInputError:
    return SizingInputError(f"config.{key}" if key else "config", message)


def _int(cfg: Mapping, key: str, hi: int, default=None, lo: int = 1) -> int:
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise _err(key, gettext("is missing"))
        return default
    # An int is checked as an int: 10**309 has no float (math.isfinite would overflow).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and (not math.isfinite(value) or value != int(value))):
        raise _err(key, gettext("must be a whole number"))
    if not lo <= value <= hi:
        raise _err(key, gettext("must be between %(lo)s and %(hi)s") % {"lo": lo, "hi": hi})
    return int(value)


def _text_config(raw: Mapping) -> Mapping:
    """The language model's fields: ``text_config`` (LLaVA & co.) filled with its family's
    transformers defaults, else the top level (Qwen2-VL keeps them there)."""
    text = raw.get("text_config")
    if text is None:
        return raw
    if not isinstance(text, Mapping):
        raise _err("text_config", gettext("must be a JSON object"))
    family = FAMILY_DEFAULTS.get(str(text.get("model_type", "llama")), {})
    return {**family, **text}


def _vision_params(raw: Mapping) -> int:
    """A ViT tower + projector: CLIP/SigLIP style (hidden_size, intermediate_size,
    num_hidden_layers) or Qwen2-VL style (embed_dim, depth, mlp_ratio); per layer 4·d²
    (attention) + 2·d·mlp, plus a two-layer projector d → h → h of the language model."""
    vc = raw.get("vision_config")
    if vc is None:
        return 0
    if not isinstance(vc, Mapping):
        raise _err("vision_config", gettext("must be a JSON object"))
    if "embed_dim" in vc or "depth" in vc:
        d = _int(vc, "embed_dim", MAX_HIDDEN)
        layers = _int(vc, "depth", MAX_LAYERS)
        ratio = vc.get("mlp_ratio", 4)
        ok = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio <= 64
        mlp = int(d * ratio) if ok else 4 * d
    else:
        try:
            d = _int(vc, "hidden_size", MAX_HIDDEN)
            layers = _int(vc, "num_hidden_layers", MAX_LAYERS)
        except SizingInputError as exc:
            raise _err("vision_config", gettext("needs hidden_size and num_hidden_layers, or embed_dim "
                                                "and depth")) from exc
        mlp = _int(vc, "intermediate_size", 16 * MAX_HIDDEN, default=4 * d)
    text_h = raw.get("text_config", raw).get("hidden_size", 4096) if isinstance(
        raw.get("text_config", raw), Mapping) else 4096
    text_h = text_h if isinstance(text_h, int) and text_h > 0 else 4096
    return layers * (4 * d * d + 2 * d * mlp) + d * text_h + text_h * text_h


def _moe(cfg: Mapping, layers: int) -> MoE | None:
    experts_key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts")
                        if cfg.get(k) is not None), None)
    if experts_key is None:
        return None
    experts = _int(cfg, experts_key, MAX_EXPERTS)
    if experts < 2:
        return None
    k = _int(cfg, "num_experts_per_tok", experts)
    width = _int(cfg, "moe_intermediate_size", 16 * MAX_HIDDEN,
                 default=_int(cfg, "intermediate_size", 16 * MAX_HIDDEN))
    shared = 0
    if cfg.get("n_shared_experts"):
        shared = _int(cfg, "n_shared_experts", MAX_EXPERTS, lo=0) * width
    elif cfg.get("shared_expert_intermediate_size"):
        shared = _int(cfg, "shared_expert_intermediate_size", 16 * MAX_HIDDEN)
    dense = _int(cfg, "first_k_dense_replace", layers, default=0, lo=0)
    return MoE(experts=experts, per_token=k, intermediate=width, shared_intermediate=shared,
               dense_layers=dense)


def _mla(cfg: Mapping) -> MLA | None:
    if cfg.get("kv_lora_rank") is None:
        return None
    return MLA(kv_rank=_int(cfg, "kv_lora_rank", MAX_HIDDEN),
               q_rank=_int(cfg, "q_lora_rank", MAX_HIDDEN, default=0, lo=0),
               nope_dim=_int(cfg, "qk_nope_head_dim", MAX_HIDDEN),
               rope_dim=_int(cfg, "qk_rope_head_dim", MAX_HIDDEN),
               v_dim=_int(cfg, "v_head_dim", MAX_HIDDEN))


def _rope(cfg: Mapping, context: int) -> RopeScaling | None:
    rs = cfg.get("rope_scaling")
    if rs is None:
        return None
    if not isinstance(rs, Mapping):
        raise _err("rope_scaling", gettext("must be a JSON object or null"))
    kind = rs.get("rope_type", rs.get("type"))
    if not isinstance(kind, str) or not kind:
        raise _err("rope_scaling", gettext("needs a type (rope_type)"))
    factor = rs.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1e4:  # nan fails too
        raise _err("rope_scaling", gettext("factor must be a positive number"))
    original = rs.get("original_max_position_embeddings")
    if original is None:  # transformers: max_position_embeddings is then the trained length
        original = context
    if isinstance(original, bool) or not isinstance(original, int) or not 1 <= original <= 100 * MAX_SEQ:
        raise _err("rope_scaling", gettext("original_max_position_embeddings must be a whole number"))
    return RopeScaling(kind=kind.lower(), factor=float(factor), original_context=original)


def _load(raw) -> Mapping:
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            raise _err("", gettext("is not valid JSON")) from None
    if not isinstance(raw, Mapping):
        raise _err("", gettext("must be a JSON object"))
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type.lower() in UNSUPPORTED_TYPES:
        raise _err("model_type", gettext("%(type)s is not a decoder-only transformer this calculator "
                                         "sizes") % {"type": model_type})
    return raw


def parse_hf_config(raw) -> Architecture:
    """A pasted HF ``config.json`` (dict or JSON text) → :class:`Architecture`."""
    raw = _load(raw)
    cfg = _text_config(raw)
    h = _int(cfg, "hidden_size", MAX_HIDDEN)
    heads = _int(cfg, "num_attention_heads", MAX_HIDDEN)
    kv = _int(cfg, "num_key_value_heads", MAX_HIDDEN, default=heads)
    head_dim = _int(cfg, "head_dim", MAX_HIDDEN, default=0, lo=0)
    if not head_dim and h % heads:
        raise _err("num_attention_heads", gettext("must divide hidden_size"))
    if heads % kv:
        raise _err("num_key_value_heads", gettext("must divide num_attention_heads"))
    layers = _int(cfg, "num_hidden_layers", MAX_LAYERS)
    tie = cfg.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))
    if not isinstance(tie, bool):
        raise _err("tie_word_embeddings", gettext("must be true or false"))
    context = _int(cfg, "max_position_embeddings", 100 * MAX_SEQ, default=4096)
    rope = _rope(cfg, context)
    if rope and rope.kind in STRETCHING_ROPE:  # the context the scaled positions reach
        context = max(context, round(rope.original_context * rope.factor))
    name = raw.get("_name_or_path") or raw.get("model_type") or "custom"
    arch = Architecture(
        name=str(name)[:80], hidden=h,
        intermediate=_int(cfg, "intermediate_size", 16 * MAX_HIDDEN, default=4 * h),
        layers=layers, heads=heads, kv_heads=kv,
        vocab=_int(cfg, "vocab_size", MAX_VOCAB), tie_embeddings=tie, max_context=context,
        qkv_bias=cfg.get("attention_bias") is True or cfg.get("model_type") in QKV_BIAS_TYPES
        or raw.get("model_type") in QKV_BIAS_TYPES,
        moe=_moe(cfg, layers), mla=_mla(cfg), rope=rope,
        vision_params=_vision_params(raw), head_dim_override=head_dim or None,
    )
    if arch.params > MAX_PARAMS_B * 1e9:
        raise _err("", gettext("describes more than %(n)sB parameters") % {"n": f"{MAX_PARAMS_B:g}"})
    return arch
