"""Each term of the engine against figures worked out by hand, for one model whose
shape is public: Llama-2-7B (config.json: hidden 4096, MLP 11008, 32 layers, 32 heads,
vocabulary 32000, untied embeddings). Every expected figure is written as its arithmetic —
SPEC.md's "VRAM rules" bytes per parameter, or the formula the engine's docstring cites —
never read from the engine, so a retyped byte count or a dropped term fails here even where
the totals of test_vram_rules.py stay within their tolerance."""

import pytest

from sizing.engine import Job
from sizing.estimation import estimate
from sizing.presets import PRESETS

H, MLP, LAYERS, HEADS, VOCAB = 4096, 11008, 32, 32, 32000
#: per layer: q, k, v, o (h×h each) and gate, up, down (h×MLP each)
LINEAR_PER_LAYER = 4 * H * H + 3 * H * MLP
#: embeddings and lm_head (untied), two RMSNorms per layer and the final one
NOT_LINEAR = 2 * VOCAB * H + LAYERS * 2 * H + H
PARAMS = LAYERS * LINEAR_PER_LAYER + NOT_LINEAR
#: rank-16 LoRA on all seven projections: A (r×in) + B (out×r) = r·(in + out) each
RANK = 16
ADAPTER = LAYERS * RANK * (4 * (H + H) + 2 * (H + MLP) + (MLP + H))
SEQ = 2048  # the SPEC tables' sequence length, micro-batch 1


def terms(method, **job):
    """The breakdown in bytes. torchtune: the SPEC tables' stack (no fp32 upcast of the
    unquantised weights, no saved 4-bit inputs), so each term is the bare formula."""
    e = estimate(Job(PRESETS["llama-2-7b"], method, seq=SEQ, framework="torchtune", **job))
    return e, {k: gb * 1e9 for k, gb in e.breakdown_gb.items()}


def test_the_hand_count_is_meta_s_published_parameter_count():
    assert PARAMS == 6_738_415_616
    assert estimate(Job(PRESETS["llama-2-7b"], "full")).params == PARAMS
    assert 0.004 <= ADAPTER / PARAMS <= 0.006  # SPEC: rank 16 ≈ 0.5% of the parameters


def test_full_fine_tune_16_bytes_per_parameter_term_by_term():
    """SPEC: bf16 weights 2 B + bf16 gradients 2 B + fp32 master 4 B + Adam m 4 B + v 4 B."""
    _, t = terms("full")
    assert t["trainable_weights"] == pytest.approx(PARAMS * 2)
    assert t["gradients"] == pytest.approx(PARAMS * 2)
    assert t["fp32_master"] == pytest.approx(PARAMS * 4)
    assert t["optimizer_states"] == pytest.approx(PARAMS * (4 + 4))
    assert t["frozen_weights"] == 0 and t["adapters"] == 0


def test_8bit_optimizer_moments_take_2_bytes_the_rest_stays():
    """SPEC: with an 8-bit optimizer m + v take 2 B: 10 B per parameter."""
    _, t = terms("full-8bit")
    assert t["optimizer_states"] == pytest.approx(PARAMS * 2)
    assert t["trainable_weights"] + t["gradients"] + t["fp32_master"] == pytest.approx(PARAMS * (2 + 2 + 4))


def test_lora_frozen_base_in_bf16_and_adapters_with_their_own_states():
    """SPEC: LoRA freezes the base (2 B/param) and trains the adapters with their own
    gradients and optimizer states: fp32 weight 4 + gradient 4 + Adam m 4 + v 4."""
    e, t = terms("lora")
    assert e.adapter_params == ADAPTER == 39_976_960
    assert t["frozen_weights"] == pytest.approx(PARAMS * 2)
    assert t["adapters"] == pytest.approx(ADAPTER * (4 + 4 + 4 + 4))
    assert t["trainable_weights"] == t["gradients"] == t["fp32_master"] == t["optimizer_states"] == 0


def test_lora_adapter_optimizer_bytes_are_the_part_an_optimizer_offload_moves():
    """Adam's m + v of the adapters (4 + 4 B each) go to host memory; the adapter weights
    and gradients stay on the card."""
    e, t = terms("lora", offload="optimizer")
    assert e.host_ram_gb * 1e9 == pytest.approx(ADAPTER * (4 + 4))
    assert t["adapters"] == pytest.approx(ADAPTER * (4 + 4))


def test_lora_adapter_optimizer_bytes_are_the_part_zero_1_shards():
    _, t = terms("lora", gpus=2, zero=1)
    assert t["adapters"] == pytest.approx(ADAPTER * (4 + 4) + ADAPTER * (4 + 4) / 2)


def test_resume_checkpoint_holds_the_adapter_with_its_states_not_the_base():
    e, _ = terms("lora")
    assert e.checkpoint_gb["resume_with_optimizer"] * 1e9 == pytest.approx(ADAPTER * (4 + 4 + 4 + 4))
    assert e.checkpoint_gb["adapter"] * 1e9 == pytest.approx(ADAPTER * 4)
    assert e.checkpoint_gb["bf16_weights"] * 1e9 == pytest.approx(PARAMS * 2)


def test_qlora_base_in_4_bit_the_rest_in_bf16():
    """SPEC: QLoRA stores the frozen base in 4 bit (≈ 0.5 B/param). Exactly: NF4 with double
    quantisation (QLoRA paper §3) is 4 bits + an 8-bit absmax per 64 weights + an fp32 scale
    per 256 absmax values, on the decoder's linear layers; embeddings, lm_head and norms stay
    bf16. Same adapters as LoRA."""
    _, t = terms("qlora")
    nf4_bytes = (4 + 8 / 64 + 32 / (64 * 256)) / 8
    assert t["frozen_weights"] == pytest.approx(LAYERS * LINEAR_PER_LAYER * nf4_bytes + NOT_LINEAR * 2)
    assert t["adapters"] == pytest.approx(ADAPTER * (4 + 4 + 4 + 4))
    # the dequantised bf16 copy of the largest linear (gate/up/down: h × MLP) for its matmul
    assert t["quant_buffers"] == pytest.approx(H * MLP * 2)


def test_activations_without_recomputation_korthikanti_eq_1():
    """No checkpointing, no FlashAttention: L × s·b·h·(34 + 5·a·s/h) bytes (Korthikanti et
    al. 2022, eq. 1, the formula the engine cites)."""
    _, t = terms("lora", checkpointing=False, flash_attention=False)
    assert t["activations"] == pytest.approx(LAYERS * SEQ * 1 * H * (34 + 5 * HEADS * SEQ / H))
    _, flash = terms("lora", checkpointing=False)
    assert flash["activations"] == pytest.approx(LAYERS * SEQ * 1 * H * 34)  # no s×s scores


def test_activations_with_checkpointing_keep_each_layer_input_and_one_layer():
    """Checkpointing: the bf16 input of each layer (2·s·b·h, L + 1 of them) plus one layer's
    recomputed activations and their gradients (2 × s·b·h·34 with FlashAttention)."""
    _, t = terms("lora")
    assert t["activations"] == pytest.approx(2 * SEQ * H * (LAYERS + 1) + 2 * SEQ * H * 34)


def test_logits_upcast_once_for_the_loss():
    """bf16 lm_head output 2 B + one fp32 copy 4 B per token per vocabulary entry."""
    _, t = terms("lora")
    assert t["logits"] == pytest.approx(SEQ * VOCAB * (2 + 4))


def test_train_hours_is_flops_over_the_cards_rate():
    """Wall time = FLOPs / (cards × dense bf16 TFLOPS × 1e12 × utilisation) / 3600: 8 cards of
    250 TFLOPS at 50 % run 1e15 FLOP/s, so 7.2e18 FLOPs take 7200 s, 2 h exactly; and with no
    rate (a card whose TFLOPS are not known) the time is unknown, not a division error."""
    from sizing.engine import train_hours

    assert train_hours(7.2e18, 8, 250, 0.5) == pytest.approx(2.0, rel=1e-9)
    assert train_hours(7.2e18, 4, 250, 0.5) == pytest.approx(4.0, rel=1e-9)
    assert train_hours(7.2e18, 8, 0, 0.5) == float("inf")
