"""The engine reproduces the SPEC's "VRAM rules" (pure Python, no database)."""

import json

import pytest

from sizing.engine import Job, train_flops, train_hours, zero_bytes_per_param
from sizing.estimation import estimate
from sizing.frameworks import SOURCE_TABLES_FRAMEWORK
from sizing.inputs import parse_request
from sizing.presets import PRESETS

# Both source tables are reproduced under their own stated assumptions (runtime overhead
# included, a loss that upcasts the logits once, no framework extras): the torchtune terms.
TABLES = {"framework": SOURCE_TABLES_FRAMEWORK}

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
    e = estimate(Job(PRESETS[model], method, flash_attention=False, **TABLES))
    assert abs(e.total_gb / spec_gb - 1) <= 0.15, e.total_gb


def test_first_document_70b_full_zero3_node_total():
    e = estimate(Job(PRESETS["llama-2-70b"], "full", gpus=8, zero=3, flash_attention=False,
                     **TABLES))
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
    assert qlo <= estimate(Job(PRESETS[model], "qlora", **TABLES)).total_gb <= qhi
    assert llo <= estimate(Job(PRESETS[model], "lora", **TABLES)).total_gb <= lhi


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
    e = estimate(Job(PRESETS["qwen2.5-72b"], "full-8bit", gpus=8, zero=3, **TABLES))
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
    assert e.checkpoint_gb["resume_with_optimizer"] == pytest.approx(512)
    assert e.checkpoint_gb["bf16_weights"] == pytest.approx(64)
    lo = estimate(Job(PRESETS["llama-2-7b"], "lora"))
    assert 0.01 <= lo.checkpoint_gb["adapter"] <= 1  # tens of MB to 1 GB
    assert estimate(Job(PRESETS["llama-2-70b"], "full")).checkpoint_gb[
        "resume_with_optimizer"] > 1000


def test_nf4_bits_and_qlora_70b_weights_about_35_gb():
    e = estimate(Job(PRESETS["llama-2-70b"], "qlora", **TABLES))
    assert 34 <= e.breakdown_gb["frozen_weights"] <= 38


def test_breakdown_sums_and_to_dict():
    e = estimate(Job(PRESETS["llama-3-8b"], "lora"))
    assert sum(e.breakdown_gb.values()) == pytest.approx(e.per_gpu_gb)
    d = e.to_dict()
    for key in ("per_gpu_gb", "total_gb", "host_ram_gb", "breakdown_gb", "checkpoint_gb",
                "warnings", "train_flops", "model_state_gb"):
        assert key in d
    assert d["breakdown_gb"]["cuda_context"] == 1.0
    states = ("frozen_weights", "trainable_weights", "gradients", "fp32_master", "optimizer_states", "adapters")
    assert d["model_state_gb"] == pytest.approx(sum(d["breakdown_gb"][k] for k in states)) and d["model_state_gb"] > 16


def test_to_dict_is_plain_json_with_the_warnings_as_a_list():
    """What a JSON consumer gets: the warnings as a list of the estimate's warnings."""
    e = estimate(Job(PRESETS["llama-2-7b"], "qlora", seq=8192))
    d = json.loads(json.dumps(e.to_dict()))
    assert isinstance(e.to_dict()["warnings"], list)
    assert d["warnings"] == list(e.warnings) and any("context" in w for w in d["warnings"])


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


def test_loss_follows_the_framework_and_warns_both_ways():
    a = PRESETS["llama-3-8b"]
    tune = estimate(Job(a, "qlora", seq=8192, framework="torchtune"))
    assert any("loss=unfused" in w for w in tune.warnings)  # a lighter loss is an assumption
    hf = estimate(Job(a, "qlora", seq=8192))  # default: Hugging Face's unfused loss
    assert hf.framework == "hf" and hf.breakdown_gb["logits"] == pytest.approx(8192 * 128256 * 14 / 1e9)
    assert any("framework=liger or unsloth" in w for w in hf.warnings)
    assert not any("loss=unfused" in w for w in hf.warnings)
    fused = estimate(Job(a, "qlora", seq=8192, framework="liger"))
    assert fused.breakdown_gb["logits"] == pytest.approx(8192 * 4096 * 6 / 1e9)
    explicit = estimate(Job(a, "qlora", seq=8192, framework="torchtune", loss="unfused"))
    assert explicit.breakdown_gb["logits"] == hf.breakdown_gb["logits"]


def test_default_is_the_heaviest_stack():
    """Safe by default: no other framework sizes the same job above Hugging Face's."""
    from sizing.frameworks import FRAMEWORKS

    for model in ("llama-3-8b", "qwen2.5-7b", "mixtral-8x7b", "llama-2-70b"):
        for method in ("qlora", "lora", "full"):
            for ckpt in (True, False):
                job = Job(PRESETS[model], method, checkpointing=ckpt, seq=4096, batch=2)
                hf = estimate(job).per_gpu_gb
                for fw in FRAMEWORKS:
                    assert estimate(Job(PRESETS[model], method, checkpointing=ckpt, seq=4096, batch=2,
                                        framework=fw)).per_gpu_gb <= hf + 1e-9, (model, method, fw)


def test_4bit_path_buffers_with_and_without_checkpointing():
    a = PRESETS["llama-3-8b"]
    tokens = 4 * 1024
    per_layer = 2 * (3 * 4096 + 4096 + 2 * 4096 + 14336) * tokens  # bf16 input of each 4-bit linear
    on, tune_on = (estimate(Job(a, "qlora", seq=1024, batch=4, framework=f)) for f in ("hf", "torchtune"))
    assert on.breakdown_gb["quant_buffers"] == pytest.approx(2 * 4096 * 14336 / 1e9)  # gate_proj in bf16
    assert on.breakdown_gb["activations"] - tune_on.breakdown_gb["activations"] == pytest.approx(
        per_layer / 1e9)
    off = estimate(Job(a, "qlora", seq=1024, batch=4, checkpointing=False))
    tune_off = estimate(Job(a, "qlora", seq=1024, batch=4, checkpointing=False, framework="torchtune"))
    assert off.breakdown_gb["activations"] - tune_off.breakdown_gb["activations"] == pytest.approx(
        32 * per_layer / 1e9)
    assert any("4-bit linear" in w for w in off.warnings)
    # PEFT's prepare_model_for_kbit_training keeps embeddings and lm_head in fp32
    assert on.breakdown_gb["frozen_weights"] - tune_on.breakdown_gb["frozen_weights"] == pytest.approx(
        2 * (a.params - a.quantisable_params) / 1e9)


def test_tokens_per_micro_batch_is_batch_times_seq():
    a = PRESETS["llama-3-8b"]
    for fw in ("hf", "unsloth", "torchtune"):
        x = estimate(Job(a, "qlora", seq=4096, batch=1, framework=fw))
        y = estimate(Job(a, "qlora", seq=1024, batch=4, framework=fw))  # packed the same tokens
        assert x.breakdown_gb["logits"] == pytest.approx(y.breakdown_gb["logits"])
        assert x.breakdown_gb["activations"] == pytest.approx(y.breakdown_gb["activations"])


def test_unsloth_offloads_checkpointed_inputs_to_host():
    a = PRESETS["llama-3.1-8b"]
    e = estimate(Job(a, "qlora", seq=32768, framework="unsloth"))
    assert e.host_ram_gb == pytest.approx(2 * 32768 * 4096 * 33 / 1e9)
    assert e.per_gpu_gb < estimate(Job(a, "qlora", seq=32768, framework="liger")).per_gpu_gb
