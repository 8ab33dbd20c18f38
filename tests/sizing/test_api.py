"""``/api/v1/estimate``: JSON keys, order, errors naming the field, never a 500."""

import json
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sizing.api_schema import PATHS
from sizing.results import PARAMS

URL = "/api/v1/estimate"
LLAMA_2_7B_CONFIG = {
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "tie_word_embeddings": False, "model_type": "llama",
}
REC_KEYS = {"offer", "gpu", "gpus", "vram_gb", "weekly_usd", "monthly_usd",
            "per_gpu_hour_usd", "in_stock"}


@pytest.fixture
def catalog(db):
    """The live demo catalog in the database (shadows tests/sizing's in-memory list)."""
    from inventory.demo import load_demo_catalog

    load_demo_catalog()


def _get(client, **params):
    return client.get(f"{URL}?{urlencode(params)}")


def test_get_keys_and_cheapest_first(client, catalog):
    r = _get(client, model="qwen2.5-32b", method="lora", tokens=20_000_000, epochs=3)
    assert r.status_code == 200 and r["Content-Type"] == "application/json"
    d = r.json()
    for key in ("per_gpu_gb", "total_gb", "host_ram_gb", "breakdown_gb", "checkpoint_gb",
                "warnings", "recommendations", "advice"):
        assert key in d
    recs = d["recommendations"]
    assert len(recs) >= 2 and all(REC_KEYS <= set(rec) for rec in recs)
    monthly = [rec["monthly_usd"] for rec in recs]
    assert monthly[0] == min(monthly)
    assert recs[0]["run_hours"] > 0 and recs[0]["order_url"].startswith(f"/order/{recs[0]['offer']}/")
    assert abs(sum(d["breakdown_gb"].values()) - d["per_gpu_gb"]) < 0.05


def test_first_document_cards_via_api(client, catalog):
    assert _get(client, model="llama-2-7b", method="qlora", flash_attention="false",
                ).json()["recommendations"][0]["offer"] == "rtx-a5000"
    assert _get(client, model="llama-2-7b", method="full", flash_attention="false",
                vendor="cuda").json()["recommendations"][0]["offer"] == "2x-a100-sxm"
    assert _get(client, model="llama-2-70b", method="full", flash_attention="false",
                vendor="any").json()["recommendations"][0]["offer"] == "8x-mi300x"


def test_offload_example(client, catalog):
    d = _get(client, model="qwen2.5-72b", method="full", gpus=8, zero=3,
             offload="optimizer").json()
    assert abs(d["host_ram_gb"] / 864 - 1) < 0.02  # SPEC: 12 B/param, 864 GB for 72B
    assert any("Offload" in w for w in d["warnings"])


def test_filters_in_stock_site_and_vendor(client, catalog):
    d = _get(client, model="llama-2-7b", method="qlora", site="PDX-1", in_stock="true").json()
    assert d["recommendations"] and all(r["in_stock"] for r in d["recommendations"])
    assert all("site=PDX-1" in r["order_url"] for r in d["recommendations"])
    d = _get(client, model="codellama-34b", method="lora", vendor="cuda").json()
    assert all(r["vendor"] == "nvidia" for r in d["recommendations"])


def test_post_config_json(client, catalog):
    r = client.post(f"{URL}?method=qlora", data=json.dumps(LLAMA_2_7B_CONFIG),
                    content_type="application/json")
    assert r.status_code == 200
    by_preset = _get(client, model="llama-2-7b", method="qlora").json()
    assert r.json()["per_gpu_gb"] == by_preset["per_gpu_gb"]


def test_post_needs_no_csrf_token(catalog):
    from django.test import Client

    r = Client(enforce_csrf_checks=True).post(URL, data=json.dumps(LLAMA_2_7B_CONFIG),
                                              content_type="application/json")
    assert r.status_code == 200


@pytest.mark.parametrize(("params", "field"), [
    ({"model": "gpt-17"}, "model"),
    ({"model": "llama-2-7b", "seq": 0}, "seq"),
    ({"params": -7}, "params"),
    ({"params": 10**9}, "params"),
    ({"model": "llama-2-7b", "gpus": 10**6}, "gpus"),
    ({"model": "llama-2-7b", "zero": 3, "gpus": 1}, "zero"),
    ({"model": "llama-2-7b", "method": "dpo"}, "method"),
    ({"model": "llama-2-7b", "checkpointing": "maybe"}, "checkpointing"),
    ({"config": "{not json"}, "config"),
    ({"model": "llama-2-7b", "site": "MARS-1"}, "site"),
    ({}, "model"),
])
def test_bad_input_400_names_the_field(client, catalog, params, field):
    r = _get(client, **params)
    assert r.status_code == 400
    d = r.json()
    assert d["error"] == "invalid" and d["field"] == field and d["message"]


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"", b"\xff\xfe", b"[" * 5000])
def test_post_malformed_config_is_400(client, catalog, body):
    r = client.post(URL, data=body, content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "config"


def test_post_config_missing_key_names_it(client, catalog):
    cfg = dict(LLAMA_2_7B_CONFIG)
    del cfg["num_hidden_layers"]
    r = client.post(URL, data=json.dumps(cfg), content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "config.num_hidden_layers"


def test_post_body_over_64kb_is_413(client, catalog):
    cfg = dict(LLAMA_2_7B_CONFIG, padding="x" * 70_000)
    r = client.post(URL, data=json.dumps(cfg), content_type="application/json")
    assert r.status_code == 413 and r.json()["error"] == "too_large"
    r = client.post(URL, data=b"x" * 300_000, content_type="application/json")
    assert r.status_code == 413


@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_other_methods_405_json(client, catalog, method):
    r = getattr(client, method)(URL)
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert "GET" in r["Allow"]


def test_schema_lists_every_parameter():
    item = PATHS["/api/v1/estimate"]
    names = {p["name"] for p in item["parameters"]}
    assert names >= set(PARAMS) - {"config"}
    assert {"get", "post"} <= set(item)
    assert "413" in item["post"]["responses"]


_values = st.one_of(
    st.text(max_size=12), st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["llama-2-7b", "qwen2.5-72b", "full", "qlora", "lora", "all", "fsdp",
                     "q,v", "true", "0", "3", "8", "65", "optimizer", "any", "DFW-1", "{}",
                     '{"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,'
                     ' "vocab_size": 100}']),
)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(PARAMS + ("junk",)), _values, max_size=8))
def test_random_queries_never_500(client, catalog, query):
    r = client.get(f"{URL}?{urlencode(query)}")
    assert r.status_code in (200, 400), (query, r.content[:300])
    body = r.json()
    if r.status_code == 200:
        assert "recommendations" in body
    elif any("\x00" in str(v) for v in query.values()):
        assert body["error"] == "bad_request"  # the NUL guard answers before the view
    else:
        assert "field" in body


# --- Integers above float range ---------------------------------------------------------

HUGE = 10**309  # no float holds it: float(HUGE) raises OverflowError
HUGE_KEYS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "intermediate_size",
             "vocab_size", "max_position_embeddings", "head_dim", "num_local_experts", "kv_lora_rank"]


@pytest.mark.parametrize("key", HUGE_KEYS)
def test_an_integer_above_float_range_is_a_clean_400(client, catalog, key):
    cfg = dict(LLAMA_2_7B_CONFIG, **{key: HUGE})
    r = client.post(URL, data=json.dumps(cfg), content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == f"config.{key}", r.content[:300]
    r = client.get("/size/", {"config": json.dumps(cfg)})
    assert r.status_code == 400 and 'id="id_config-error"' in r.content.decode()


@pytest.mark.parametrize("extra", [{"rope_scaling": {"rope_type": "yarn", "factor": HUGE}},
                                   {"rope_scaling": {"rope_type": "yarn", "factor": 2,
                                                     "original_max_position_embeddings": HUGE}},
                                   {"vision_config": {"hidden_size": HUGE, "num_hidden_layers": 2}},
                                   {"text_config": {"hidden_size": HUGE}}])
def test_huge_integers_in_nested_config_are_400s(client, catalog, extra):
    r = client.post(URL, data=json.dumps(dict(LLAMA_2_7B_CONFIG, **extra)), content_type="application/json")
    assert r.status_code == 400 and r.json()["field"].startswith("config"), r.content[:300]


@pytest.mark.parametrize("param", ["params", "seq", "batch", "gpus", "zero"])
def test_huge_integers_in_the_query_are_400s(client, catalog, param):
    r = client.get(URL, {"model": "llama-2-7b", param: str(HUGE)})
    assert r.status_code == 400 and r.json()["field"] == param
