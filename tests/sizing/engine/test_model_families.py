"""Pasted config.json of the families customers bring: MoE, latent attention, vision-language,
RoPE scaling — each sized, or refused with a 400 naming the field."""

import json
from pathlib import Path

import pytest

from sizing.engine import KORTHIKANTI_MLP, KORTHIKANTI_NON_MLP, Job, layer_factor
from sizing.errors import SizingInputError
from sizing.estimation import estimate
from sizing.hf_config import parse_hf_config
from sizing.presets import PRESETS

CONFIGS = Path(__file__).parent.parent / "configs"


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


# published totals (model cards): Mixtral 46.7B, Qwen1.5-MoE-A2.7B 14.3B, DeepSeek-V2-Lite
# 15.7B, llava-1.5-7b 7.06B, Qwen2-VL-7B 8.29B, Llama 3.1 8B 8.03B, Qwen2.5-7B 7.62B
@pytest.mark.parametrize(("name", "billions"), [
    ("mixtral-8x7b-v0.1", 46.7), ("qwen1.5-moe-a2.7b", 14.3), ("deepseek-v2-lite", 15.7),
    ("llava-1.5-7b-hf", 7.06), ("qwen2-vl-7b-instruct", 8.29), ("llama-3.1-8b", 8.03),
    ("qwen2.5-7b-instruct-yarn", 7.62),
])
def test_real_configs_parse_to_the_published_size(name, billions):
    arch = parse_hf_config(_config(name))
    assert arch.params / 1e9 == pytest.approx(billions, rel=0.01)


def test_moe_keeps_every_expert_and_activates_k():
    arch = parse_hf_config(_config("mixtral-8x7b-v0.1"))
    assert arch.moe.experts == 8 and arch.moe.per_token == 2
    assert arch.params == PRESETS["mixtral-8x7b"].params
    # the MLP's activations scale with 2 experts of 14336 against a dense SwiGLU of 8h/3
    assert layer_factor(arch) == pytest.approx(
        KORTHIKANTI_NON_MLP + KORTHIKANTI_MLP * 2 * 14336 / (8 / 3 * 4096))
    e = estimate(Job(arch, "qlora"))
    assert any("all 8 experts" in w and "2 of them" in w for w in e.warnings)
    # QLoRA quantises every expert: the 4-bit weights are ~ 46.7e9 × 4.127 bits
    assert 22 < e.breakdown_gb["frozen_weights"] < 26
    # adapters on every expert (PEFT all-linear)
    lora = estimate(Job(arch, "lora"))
    dense_like = estimate(Job(PRESETS["mistral-7b"], "lora"))
    assert lora.adapter_params > 5 * dense_like.adapter_params


def test_shared_experts_and_dense_first_layer():
    qwen = parse_hf_config(_config("qwen1.5-moe-a2.7b"))
    assert qwen.moe.shared_intermediate == 5632 and qwen.qkv_bias
    ds = parse_hf_config(_config("deepseek-v2-lite"))
    assert ds.moe.dense_layers == 1 and ds.moe.shared_intermediate == 2 * 1408
    assert ds.mla.kv_rank == 512 and ds.mla.q_rank == 0
    assert estimate(Job(ds, "lora")).per_gpu_gb > 2 * 15.7  # bf16 base of every expert


def test_vision_language_tower_frozen_in_bf16():
    llava = parse_hf_config(_config("llava-1.5-7b-hf"))
    assert llava.vocab == 32064 and llava.hidden == 4096  # text_config + LlamaConfig defaults
    assert 0.3e9 < llava.vision_params < 0.35e9
    e = estimate(Job(llava, "full"))
    assert e.breakdown_gb["frozen_weights"] == pytest.approx(2 * llava.vision_params / 1e9)
    assert e.model_state_gb == pytest.approx((16 * llava.language_params + 2 * llava.vision_params) / 1e9)
    assert any("Vision tower" in w for w in e.warnings)
    qvl = parse_hf_config(_config("qwen2-vl-7b-instruct"))
    assert 0.6e9 < qvl.vision_params < 0.7e9 and qvl.rope.kind == "mrope"
    assert not any("RoPE" in w for w in estimate(Job(qvl, "qlora", seq=16384)).warnings)


def test_rope_scaling_warnings():
    yarn = parse_hf_config(_config("qwen2.5-7b-instruct-yarn"))
    assert yarn.max_context == 131072 and yarn.rope.original_context == 32768
    assert not any("RoPE" in w for w in estimate(Job(yarn, "qlora", seq=32768)).warnings)
    far = estimate(Job(yarn, "qlora", seq=65536)).warnings
    assert any("stretches RoPE (yarn ×4)" in w for w in far)
    llama31 = parse_hf_config(_config("llama-3.1-8b"))  # trained for 128k: no stretch warning
    assert not any("RoPE" in w for w in estimate(Job(llama31, "qlora", seq=100_000)).warnings)
    beyond = estimate(Job(llama31, "qlora", seq=200_000)).warnings
    assert any("beyond" in w and "131072" in w for w in beyond)


@pytest.mark.parametrize(("cfg", "field"), [
    (_config("t5-base"), "config.model_type"),
    ({**_config("llava-1.5-7b-hf"), "vision_config": {"image_size": 336}}, "config.vision_config"),
    ({**_config("llava-1.5-7b-hf"), "text_config": [1, 2]}, "config.text_config"),
    ({**_config("deepseek-v2-lite"), "rope_scaling": {"factor": 40}}, "config.rope_scaling"),
    ({**_config("deepseek-v2-lite"), "rope_scaling": "yarn"}, "config.rope_scaling"),
    ({**_config("mixtral-8x7b-v0.1"), "num_experts_per_tok": 9}, "config.num_experts_per_tok"),
    ({**_config("mixtral-8x7b-v0.1"), "num_local_experts": "eight"}, "config.num_local_experts"),
    ({**_config("deepseek-v2-lite"), "qk_rope_head_dim": None}, "config.qk_rope_head_dim"),
])
def test_unsizable_configs_name_the_field(cfg, field):
    with pytest.raises(SizingInputError) as exc:
        parse_hf_config(cfg)
    assert exc.value.field == field and exc.value.message


@pytest.fixture
def demo(db):
    from inventory.demo import load_demo_catalog

    load_demo_catalog()


@pytest.mark.parametrize("name", ["mixtral-8x7b-v0.1", "qwen1.5-moe-a2.7b", "deepseek-v2-lite",
                                  "llava-1.5-7b-hf", "qwen2-vl-7b-instruct"])
def test_api_and_page_size_each_family(client, demo, name):
    body = (CONFIGS / f"{name}.json").read_text()
    r = client.post("/api/v1/estimate?method=qlora&vendor=any", data=body, content_type="application/json")
    assert r.status_code == 200, r.content[:300]
    d = r.json()
    assert d["params"] == parse_hf_config(json.loads(body)).params and d["recommendations"]
    page = client.get("/size/", {"config": body, "method": "qlora"}, HTTP_HX_REQUEST="true")
    assert page.status_code == 200 and "Order this" in page.content.decode()


def test_api_400_and_page_form_error_for_an_encoder_decoder(client, demo):
    body = (CONFIGS / "t5-base.json").read_text()
    r = client.post("/api/v1/estimate", data=body, content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "config.model_type"
    assert "decoder-only" in r.json()["message"]
    page = client.get("/size/", {"config": body})
    assert page.status_code == 400
    assert 'id="id_config-error"' in page.content.decode()
