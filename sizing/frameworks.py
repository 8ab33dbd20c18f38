"""What each training stack adds to the memory of the same job (pure Python, no Django).

The physics (weights, optimizer states, Korthikanti activations) is the same everywhere;
the stacks differ in four documented places, and only there:

* **loss** — how many bytes per logit the cross-entropy keeps (``LOGITS_BYTES`` in
  ``engine``): Hugging Face's causal-LM loss upcasts the whole s×V logits to fp32 and keeps
  a shifted copy and the log-softmax for backward ("unfused", 14 B); torchtune's chunked
  cross-entropy keeps the bf16 logits plus one fp32 upcast ("standard", 6 B); Liger's
  ``LigerFusedLinearCrossEntropyLoss`` and Unsloth's fused/Cut-Cross-Entropy loss never
  materialise the logits, only a chunk about the size of the hidden states ("fused").
* **upcast of unquantised weights on the 4-bit path** — PEFT's
  ``prepare_model_for_kbit_training`` (called by TRL's SFTTrainer and axolotl for QLoRA)
  casts every non-4-bit parameter (embeddings, lm_head, norms) to fp32: 4 B instead of 2.
* **4-bit linear buffers** — bitsandbytes' ``Linear4bit`` dequantises its weight to bf16
  for every matmul (one layer's worth at a time) and its autograd function keeps the bf16
  input of every 4-bit linear for the backward pass. torchao's NF4 (torchtune) and
  Unsloth's fused LoRA kernels dequantise too but keep no extra input copies.
* **fused layers** — Unsloth's kernels (LoRA MLP and QKV, RMSNorm, RoPE) and torch.compile
  (its partitioner recomputes pointwise ops in backward) keep only each layer's matmul
  inputs and outputs; the others keep Korthikanti's 34 bytes per token per hidden unit.
* **adapter dtype** — PEFT keeps LoRA adapters, their gradients and AdamW moments in fp32;
  torchtune trains everything in bf16 (the moments follow the parameters' dtype).

``torchtune`` keeps the terms the SPEC's tables state (one fp32 upcast of the logits, fp32
adapters, Korthikanti's layer): heavier than a real torchtune run, so it stays the tables'
term set. ``torchtune-compile`` is torchtune as its README measures it (``compile=True``):
``CEWithChunkedOutputLoss`` over 8 chunks, bf16 adapters and moments, fused layers.
* **checkpointing** — every stack here turns activation checkpointing on by default for
  LoRA/QLoRA (PEFT ``prepare_model_for_kbit_training(use_gradient_checkpointing=True)``,
  TRL ``SFTConfig``, the torchtune and axolotl recipes, Unsloth); plain ``transformers.
  Trainer`` leaves it off, so the calculator shows the switch. Unsloth's
  ``use_gradient_checkpointing="unsloth"`` moves the checkpointed layer inputs to host RAM.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.translation import gettext_lazy as _


@dataclass(frozen=True, slots=True)
class Framework:
    key: str
    label: str  # lazily translated
    loss: str  # a key of engine.LOGITS_BYTES
    upcast_unquantised: bool  # PEFT prepare_model_for_kbit_training: non-4-bit params → fp32
    saves_4bit_inputs: bool  # bitsandbytes MatMul4Bit keeps each 4-bit linear's bf16 input
    offloads_checkpoints: bool  # checkpointed layer inputs live in host RAM
    fused_layers: bool = False  # a layer keeps only its matmuls' inputs/outputs (engine.FUSED_LAYER_BYTES)
    adapter_bytes: float = 4.0  # a LoRA adapter parameter's dtype: fp32 (PEFT) or bf16 (torchtune)


FRAMEWORKS: dict[str, Framework] = {f.key: f for f in (
    Framework("hf", _("Hugging Face Trainer / PEFT / TRL + bitsandbytes"), "unfused", True, True, False),
    Framework("axolotl", _("axolotl (Hugging Face Trainer underneath)"), "unfused", True, True, False),
    Framework("liger", _("Hugging Face + Liger Kernel (fused linear cross-entropy)"), "fused", True, True,
              False),
    Framework("unsloth", _("Unsloth (fused loss, offloaded checkpoints)"), "fused", False, False, True,
              fused_layers=True),
    Framework("torchtune", _("torchtune (chunked cross-entropy, torchao NF4)"), "standard", False, False,
              False),
    Framework("torchtune-compile", _("torchtune with torch.compile (8-chunk loss, bf16 adapters, fused layers)"),
              "chunked", False, False, False, fused_layers=True, adapter_bytes=2.0),
)}
DEFAULT_FRAMEWORK = "hf"

#: The two source tables' stated assumptions (runtime overhead included, a loss that upcasts
#: the logits once, no fp32 upcast of the unquantised weights, no per-linear input copies)
#: are exactly the torchtune terms; the tables page says so.
SOURCE_TABLES_FRAMEWORK = "torchtune"
