"""Property tests (hypothesis): monotone memory, and parse_request never crashes."""

import json
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sizing.engine import METHODS, Job
from sizing.estimation import estimate
from sizing.inputs import SizingInputError, parse_request
from sizing.presets import PRESETS

presets = st.sampled_from(sorted(PRESETS))
methods = st.sampled_from(METHODS)
flags = st.booleans()


def _job(model, method, ckpt, flash, **kw):
    return Job(PRESETS[model], method, checkpointing=ckpt, flash_attention=flash, **kw)


@settings(deadline=None)  # no deadline: a loaded CI machine stalls past hypothesis's 200 ms
@given(presets, methods, flags, flags, st.integers(1, 131072), st.integers(1, 131072))
def test_memory_grows_with_seq(model, method, ckpt, flash, s1, s2):
    lo, hi = sorted((s1, s2))
    a = estimate(_job(model, method, ckpt, flash, seq=lo)).per_gpu_gb
    assert a <= estimate(_job(model, method, ckpt, flash, seq=hi)).per_gpu_gb


@settings(deadline=None)
@given(presets, methods, flags, flags, st.integers(1, 1024), st.integers(1, 1024))
def test_memory_grows_with_batch(model, method, ckpt, flash, b1, b2):
    lo, hi = sorted((b1, b2))
    a = estimate(_job(model, method, ckpt, flash, batch=lo)).per_gpu_gb
    assert a <= estimate(_job(model, method, ckpt, flash, batch=hi)).per_gpu_gb


@settings(deadline=None)
@given(methods, st.floats(0.001, 2000), st.floats(0.001, 2000), st.integers(1, 8192))
def test_memory_grows_with_params(method, p1, p2, seq):
    lo, hi = sorted((p1, p2))
    a = estimate(parse_request({"params": lo, "method": method, "seq": seq}).job)
    b = estimate(parse_request({"params": hi, "method": method, "seq": seq}).job)
    assert a.per_gpu_gb <= b.per_gpu_gb * (1 + 1e-12)


@settings(deadline=None)
@given(presets, methods, st.integers(2, 64), st.sampled_from(["none", "optimizer"]))
def test_more_sharding_never_costs_memory_per_gpu(model, method, gpus, offload):
    base = _job(model, method, True, True, gpus=gpus)
    stages = range(1, 4) if offload != "none" else range(0, 4)
    per = [estimate(replace(base, zero=z, offload=offload)).per_gpu_gb for z in stages]
    assert all(a >= b - 1e-9 for a, b in zip(per, per[1:], strict=False))


@settings(deadline=None)
@given(presets, methods, st.integers(2, 63))
def test_more_gpus_never_costs_memory_per_gpu_under_zero3(model, method, n):
    a = estimate(_job(model, method, True, True, gpus=n, zero=3)).per_gpu_gb
    assert a >= estimate(_job(model, method, True, True, gpus=n + 1, zero=3)).per_gpu_gb


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.one_of(json_scalars, st.lists(json_scalars, max_size=3),
                   st.dictionaries(st.text(max_size=8), json_scalars, max_size=4))
keys = st.sampled_from(["model", "params", "method", "seq", "batch", "checkpointing",
                        "flash_attention", "lora_rank", "lora_targets", "gpus", "zero",
                        "offload", "tokens", "epochs", "utilisation", "vendor", "site",
                        "in_stock", "config", "loss", "framework"])
config_keys = st.sampled_from(["hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "vocab_size",
                               "tie_word_embeddings", "max_position_embeddings",
                               # mixtures of experts, latent attention, RoPE scaling, vision
                               "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                               "n_shared_experts", "first_k_dense_replace", "kv_lora_rank",
                               "qk_rope_head_dim", "rope_scaling", "vision_config", "text_config",
                               "model_type", "head_dim"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, values, max_size=8))
def test_parse_request_only_raises_input_error(params):
    try:
        req = parse_request(params)
    except SizingInputError as e:
        assert e.field and e.message
    else:
        estimate(req.job)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(config_keys, st.one_of(json_scalars, st.integers(1, 100000),
                                             st.dictionaries(st.sampled_from(
                                                 ["type", "factor", "hidden_size", "depth", "embed_dim",
                                                  "num_hidden_layers", "original_max_position_embeddings"]),
                                                 st.one_of(json_scalars, st.integers(1, 5000)), max_size=4)),
                       max_size=12), methods)
def test_config_json_never_crashes(cfg, method):
    try:
        req = parse_request({"config": cfg, "method": method})
    except SizingInputError as e:
        assert e.field.startswith("config")
    else:
        assert estimate(req.job).per_gpu_gb > 0


_REAL = {p.stem: json.loads(p.read_text()) for p in (Path(__file__).parent.parent / "configs").glob("*.json")}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(_REAL)), st.data(), methods, st.sampled_from(["hf", "unsloth", "torchtune"]))
def test_real_configs_with_one_field_mangled_never_crash(name, data, method, framework):
    cfg = dict(_REAL[name])
    key = data.draw(st.sampled_from(sorted(cfg)))
    cfg[key] = data.draw(st.one_of(json_scalars, st.integers(0, 10**7), st.lists(json_scalars, max_size=2),
                                   st.dictionaries(st.text(max_size=8), json_scalars, max_size=3)))
    try:
        req = parse_request({"config": cfg, "method": method, "framework": framework})
    except SizingInputError as e:
        assert e.field.startswith("config")
    else:
        assert estimate(req.job).per_gpu_gb > 0


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(presets, st.sampled_from(["full", "full-8bit", "lora"]), st.sampled_from(["none", "optimizer", "all"]),
       st.lists(st.integers(16, 4096), min_size=13, max_size=13))
def test_no_recommended_plan_offloads_more_than_its_instance_holds(model, method, offload, rams):
    """Whatever RAM each offer's instance has, every plan shown (best and alternatives)
    moves to the host no more than the instance's usable RAM."""
    from sizing.recommend import recommend, usable_host_gb
    from tests.sizing.conftest import build_catalog

    cands = [replace(c, host_ram_gb=ram) for c, ram in zip(build_catalog(), rams, strict=True)]
    job = _job(model, method, True, True, zero=3 if offload != "none" else 0, offload=offload)
    for option in recommend(job, cands, vendor="any").options:
        assert option.estimate.host_ram_gb <= usable_host_gb(option.candidate.host_ram_gb)
