"""The engine reproduces the SPEC's "VRAM rules" (pure Python, no database)."""

import pytest

from sizing.engine import Job, estimate, train_flops, train_hours, zero_bytes_per_param
from sizing.inputs import parse_request
from sizing.presets import PRESETS

# First document: checkpointing on, seq 2048, batch 1, rank 16; it does not assume
# FlashAttention, so these rows keep the s² attention scores (flash_attention=False).
FIRST_DOC = [
    ("llama-2-7b", "qlora", 10), ("llama-2-13b", "qlora", 14), ("llama-2-7b", "lora", 21),
    ("codellama-34b", "qlora", 28), ("yi-34b", "qlora", 28), ("llama-2-13b", "lora", 33),
    ("llama-2-70b", "qlora", 51), ("codellama-34b", "lora", 79), ("yi-34b", "lora", 79),
    ("llama-2-7b", "full", 129), ("llama-2-70b", "lora", 156),
]


@pytest.mark.parametrize(("model", "method", "spec_gb"), FIRST_DOC)
def test_first_document_rows_within_15_percent(model, method, spec_gb):
    e = estimate(Job(PRESETS[model], method, flash_attention=False))
    assert abs(e.total_gb / spec_gb - 1) <= 0.15, e.total_gb


def test_first_document_70b_full_zero3_node_total():
    e = estimate(Job(PRESETS["llama-2-70b"], "full", gpus=8, zero=3, flash_attention=False))
    assert abs(e.total_gb / 1288 - 1) <= 0.15
    assert e.per_gpu_gb <= 192  # on 8× MI300X


# Second document: seq 2048, micro-batch 1, checkpointing and FlashAttention-2.
SECOND_DOC = [
    ("llama-3-8b", 8, 12, 20, 26), ("qwen2.5-7b", 8, 12, 20, 26),
    ("qwen2.5-14b", 14, 18, 34, 42), ("qwen2.5-32b", 24, 32, 72, 86),
    ("qwen2.5-72b", 46, 58, 155, 175),
]


@pytest.mark.parametrize(("model", "qlo", "qhi", "llo", "lhi"), SECOND_DOC)
def test_second_document_rows_within_range(model, qlo, qhi, llo, lhi):
    assert qlo <= estimate(Job(PRESETS[model], "qlora")).total_gb <= qhi
    assert llo <= estimate(Job(PRESETS[model], "lora")).total_gb <= lhi


@pytest.mark.parametrize(("stage", "per_param", "gb"),
                         [(1, 4 + 12 / 8, 176), (2, 2 + 14 / 8, 120), (3, 16 / 8, 64)])
def test_zero_table_exact(stage, per_param, gb):
    assert zero_bytes_per_param("full", stage, 8) == pytest.approx(per_param)
    assert zero_bytes_per_param("full", stage, 8) * 32e9 / 1e9 == pytest.approx(gb)
    e = estimate(parse_request({"params": 32, "method": "full", "gpus": 8,
                                "zero": stage}).job)
    assert e.model_state_gb == pytest.approx(gb)


def test_zero_offload_exact():
    assert zero_bytes_per_param("full", 3, 8, "optimizer") * 32e9 / 1e9 == pytest.approx(16)
    assert zero_bytes_per_param("full", 0, 1) == 16
    assert zero_bytes_per_param("full-8bit", 0, 1) == 10


def test_offload_example_72b():
    e = estimate(parse_request({"params": 72, "method": "full", "gpus": 8, "zero": 3,
                                "offload": "optimizer"}).job)
    assert e.host_ram_gb == pytest.approx(864)
    assert e.model_state_gb == pytest.approx(36)
    assert any("throughput" in w for w in e.warnings)


def test_8x_h200_8bit_about_90_gb_per_card():
    e = estimate(Job(PRESETS["qwen2.5-72b"], "full-8bit", gpus=8, zero=3))
    assert abs(e.model_state_gb / 90 - 1) <= 0.15
    assert e.per_gpu_gb <= 141 - 7.05  # fits an H200 with headroom


def test_full_states_7b_112_and_70_gb():
    e = estimate(parse_request({"params": 7, "method": "full"}).job)
    assert e.model_state_gb == pytest.approx(112)
    e8 = estimate(parse_request({"params": 7, "method": "full-8bit"}).job)
    assert e8.model_state_gb == pytest.approx(70)


def test_runtime_example_32b():
    flops = train_flops(32_000_000_000, 20_000_000, 3)
    assert flops == pytest.approx(1.152e19)
    hours = train_hours(flops, 8, 989, 0.30)  # H100 SXM dense bf16 989 TFLOPS
    assert abs(hours / 1.5 - 1) <= 0.15 and hours == pytest.approx(1.348, rel=1e-3)


def test_checkpoint_sizes_32b():
    e = estimate(parse_request({"params": 32, "method": "full"}).job)
    assert e.checkpoint_gb["full_with_optimizer"] == pytest.approx(512)
    assert e.checkpoint_gb["bf16_weights"] == pytest.approx(64)
    lo = estimate(Job(PRESETS["llama-2-7b"], "lora"))
    assert 0.01 <= lo.checkpoint_gb["adapter"] <= 1  # tens of MB to 1 GB
    assert estimate(Job(PRESETS["llama-2-70b"], "full")).checkpoint_gb[
        "full_with_optimizer"] > 1000


def test_nf4_bits_and_qlora_70b_weights_about_35_gb():
    e = estimate(Job(PRESETS["llama-2-70b"], "qlora"))
    assert 34 <= e.breakdown_gb["frozen_weights"] <= 38


def test_breakdown_sums_and_to_dict():
    e = estimate(Job(PRESETS["llama-3-8b"], "lora"))
    assert sum(e.breakdown_gb.values()) == pytest.approx(e.per_gpu_gb)
    d = e.to_dict()
    for key in ("per_gpu_gb", "total_gb", "host_ram_gb", "breakdown_gb", "checkpoint_gb",
                "warnings", "train_flops", "model_state_gb"):
        assert key in d
    assert d["breakdown_gb"]["cuda_context"] == 1.0


def test_warnings_context_and_cluster():
    e = estimate(Job(PRESETS["llama-2-7b"], "qlora", seq=8192))
    assert any("context" in w for w in e.warnings)
    e = estimate(Job(PRESETS["llama-2-70b"], "full", gpus=16, zero=3))
    assert any("on-demand cluster" in w for w in e.warnings)


def test_flash_attention_and_checkpointing_save_memory():
    a = PRESETS["llama-2-7b"]
    on = estimate(Job(a, "lora")).per_gpu_gb
    assert estimate(Job(a, "lora", flash_attention=False)).per_gpu_gb > on
    assert estimate(Job(a, "lora", checkpointing=False)).per_gpu_gb > on


def test_big_vocabulary_warns_about_an_unfused_loss():
    from sizing.engine import Job, estimate
    from sizing.presets import PRESETS

    big_vocab = estimate(Job(PRESETS["llama-3-8b"], "qlora", seq=8192))
    assert any("loss=unfused" in w for w in big_vocab.warnings)
    unfused = estimate(Job(PRESETS["llama-3-8b"], "qlora", seq=8192, loss="unfused"))
    assert not any("loss=unfused" in w for w in unfused.warnings)
    assert unfused.per_gpu_gb > big_vocab.per_gpu_gb
