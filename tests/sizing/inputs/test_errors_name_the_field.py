"""Input validation names the offending field."""

import json

import pytest

from sizing.inputs import SizingInputError, parse_request
from sizing.presets import PRESETS

LLAMA2_7B_CONFIG = {
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "tie_word_embeddings": False, "max_position_embeddings": 4096,
}


@pytest.mark.parametrize(("params", "field"), [
    ({"model": "gpt-9"}, "model"),
    ({"model": "llama-2-7b", "seq": 0}, "seq"),
    ({"model": "llama-2-7b", "seq": "2048.5"}, "seq"),
    ({"params": -7}, "params"),
    ({"params": 5000}, "params"),
    ({"params": "nan"}, "params"),
    ({"model": "llama-2-7b", "batch": 4096}, "batch"),
    ({"model": "llama-2-7b", "gpus": 65}, "gpus"),
    ({"model": "llama-2-7b", "zero": 3}, "zero"),
    ({"model": "llama-2-7b", "gpus": 2, "zero": 4}, "zero"),
    ({"model": "llama-2-7b", "method": "dora"}, "method"),
    ({"model": "llama-2-7b", "lora_targets": "q_proj,foo"}, "lora_targets"),
    ({"model": "llama-2-7b", "offload": "optimizer"}, "offload"),
    ({"config": "{not json"}, "config"),
    ({"config": {"hidden_size": 4096}}, "config.num_attention_heads"),
    ({"config": {**LLAMA2_7B_CONFIG, "num_attention_heads": 30}}, "config.num_attention_heads"),
    ({}, "model"),
    ({"model": "llama-2-7b", "params": 7}, "params"),
])
def test_bad_input_names_field(params, field):
    with pytest.raises(SizingInputError) as exc:
        parse_request(params)
    assert exc.value.field == field


def test_query_strings_parse():
    req = parse_request({"model": "qwen2.5-7b", "method": "lora", "seq": "4096",
                         "batch": "2", "checkpointing": "false", "lora_targets": "q_proj,v",
                         "gpus": "8", "zero": "fsdp", "vendor": "any", "in_stock": "1",
                         "site": "dfw-1"})
    j = req.job
    assert (j.seq, j.batch, j.checkpointing, j.zero, j.gpus) == (4096, 2, False, 3, 8)
    assert j.lora_targets == ("q_proj", "v_proj")
    assert (req.vendor, req.in_stock, req.site) == ("any", True, "DFW-1")


def test_config_json_matches_preset():
    arch = parse_request({"config": json.dumps(LLAMA2_7B_CONFIG)}).job.arch
    assert arch.params == PRESETS["llama-2-7b"].params


def test_params_only_infers_llama_shape():
    arch = parse_request({"params": 7}).job.arch
    assert arch.params == 7_000_000_000
    assert arch.hidden == 4096 and arch.intermediate == 11008 and arch.heads == 32
    assert arch.vocab == 32000
