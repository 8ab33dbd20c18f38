"""The calculator page, its htmx fragment and the generated tables page."""

import re
from urllib.parse import urlencode

import pytest
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sizing.figures import faq_vram_figures
from sizing.forms import SizingForm
from sizing.templatetags.sizing_tags import bar_geometry


@pytest.fixture
def catalog(db):
    """The live demo catalog in the database (shadows tests/sizing's in-memory list)."""
    from inventory.demo import load_demo_catalog
    from rental.demo import load_demo_images

    load_demo_catalog()
    load_demo_images()


def _get(client, query="", **headers):
    return client.get(reverse("sizing") + query, **headers)


def test_urls():
    assert reverse("sizing") == "/size/"
    assert reverse("sizing_tables") == "/size/tables/"
    assert reverse("api_estimate") == "/api/v1/estimate"


def test_default_page_shows_the_13b_lora_answer(client, catalog):
    r = _get(client)
    assert r.status_code == 200
    html = r.content.decode()
    assert '<option value="llama-2-13b" selected>' in html
    assert "llama-2-13b, lora" in html
    assert 'id="sizing-results"' in html and "<svg" in html
    assert 'hx-get="/size/"' in html and 'hx-push-url="true"' in html
    assert 'method="get" action="/size/"' in html  # works as a plain form
    assert "Order this" in html and 'href="/order/' in html


def test_page_links_js_and_css_without_inline_script(client, catalog):
    html = _get(client).content.decode()
    assert "js/sizing.js" in html and "css/sizing.css" in html
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)


def test_nav_links_to_the_calculator(client, catalog):
    assert b'href="/size/"' in client.get("/").content


def test_htmx_returns_only_the_results_fragment(client, catalog):
    r = _get(client, "?model=llama-2-7b&method=qlora", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    html = r.content.decode()
    assert "<html" not in html and "<form" not in html
    assert 'id="sizing-results-body"' in html and "llama-2-7b, qlora" in html


def test_plain_get_form_submission(client, catalog):
    query = ("?model=&params=7&config=&method=full-8bit&seq=4096&batch=2&checkpointing=on"
             "&flash_attention=off&lora_rank=16&lora_targets=all&gpus=1&zero=0&offload=none"
             "&tokens=10000000&epochs=2&vendor=any&site=")
    r = _get(client, query)
    assert r.status_code == 200
    html = r.content.decode()
    assert "llama-style-7b, full-8bit" in html
    assert "Training time and cost" in html and "FLOPs" in html
    assert '<option value="full-8bit" selected>' in html  # the form keeps the input


def test_unchecked_boxes_and_missing_selects_use_defaults(client, catalog):
    r = _get(client, "?model=llama-2-7b")
    assert r.status_code == 200
    assert b"llama-2-7b, qlora" in r.content  # engine default method


def test_breakdown_bar_against_card(client, catalog):
    html = _get(client, "?model=llama-2-70b&method=qlora").content.decode()
    assert "A100 SXM, 80 GB" in html  # bar title names the recommended card
    assert "usable 76.0 GB" in html and "card 80 GB" in html
    for label in ("Frozen base weights", "LoRA adapters", "Activations", "Logits",
                  "CUDA context", "Allocator margin"):
        assert label in html
    assert "Checkpoints on disk" in html


def test_recommendations_cheapest_first_with_order_links(client, catalog):
    html = _get(client, "?model=codellama-34b&method=lora&vendor=any").content.decode()
    rows = re.findall(r'<tr(?: class="best")?>\s*<th scope="row">([^<]+)<br>', html)
    assert rows[0] == "MI300X"
    assert 'href="/order/mi300x/?site=' in html
    recs = html.split('class="catalog sizing-recs"')[1].split("</table>")[0]
    prices = [int(p.replace(",", "")) for p in re.findall(
        r'data-label="Month">\$([\d,]+)</td>', recs)]
    assert prices[0] == min(prices)


def test_site_filter_goes_into_order_link(client, catalog):
    html = _get(client, "?model=llama-2-7b&method=qlora&site=PDX-1").content.decode()
    assert "?site=PDX-1" in html


def test_more_than_a_node_advises_a_cluster(client, catalog):
    html = _get(client, "?model=llama-2-70b&method=full").content.decode()
    assert "on-demand cluster" in html
    html = _get(client, "?model=llama-2-7b&method=lora&gpus=16").content.decode()
    assert "on-demand cluster" in html


@pytest.mark.parametrize(("query", "field"), [
    ("?model=no-such-model", "model"),
    ("?model=llama-2-7b&seq=0", "seq"),
    ("?params=-7", "params"),
    ("?params=1e9", "params"),
    ("?model=llama-2-7b&batch=100000", "batch"),
    ("?model=llama-2-7b&zero=3&gpus=1", "zero"),
    ("?config=%7Bnot+json", "config"),
    ("?config=%7B%22hidden_size%22%3A+4096%7D", "config"),
    ("?model=llama-2-7b&lora_targets=foo", "lora_targets"),
    ("?model=llama-2-7b&site=MARS-1", "site"),
])
def test_bad_input_is_400_with_the_field_error_inline(client, catalog, query, field):
    r = _get(client, query)
    assert r.status_code == 400
    html = r.content.decode()
    assert f'id="id_{field}-error"' in html  # message next to its field
    assert "Order this" not in html
    r = _get(client, query, HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and f"({field})" in r.content.decode()


def test_calculator_queries_do_not_grow_with_nodes(client, catalog, django_assert_max_num_queries):
    from inventory.models import GpuModel, GpuSlot, Node, Site

    with django_assert_max_num_queries(6) as small:
        _get(client, "?model=llama-2-7b")
    gpu, site = GpuModel.objects.get(slug="rtx-a5000"), Site.objects.first()
    for i in range(20):
        node = Node.objects.create(site=site, gpu_model=gpu, name=f"extra-{i}", gpu_count=4,
                                   vcpus=32, host_ram_gb=256)
        GpuSlot.objects.bulk_create(GpuSlot(node=node, index=k) for k in range(4))
    with django_assert_max_num_queries(len(small.captured_queries)):
        assert _get(client, "?model=llama-2-7b").status_code == 200


def test_tables_page_generated_rows(client, catalog):
    r = client.get(reverse("sizing_tables"))
    assert r.status_code == 200
    html = r.content.decode()
    rows = dict(re.findall(r'<th scope="row">([^<]+)<br><small class="muted">[^<]*</small></th>'
                           r'\s*<td class="num"[^>]*>[^<]*</td>\s*<td[^>]*>([^<]+)', html))
    assert rows["70B full, ZeRO-3 across a node"].strip() == "8× MI300X"
    assert rows["34B LoRA"].strip() == "MI300X"
    assert rows["7B full (CUDA only)"].strip() == "2× A100 SXM"
    assert rows["7B QLoRA"].strip() == "RTX A5000"
    assert rows["70B QLoRA"].strip() == "A100 SXM"
    assumptions = re.findall(r'class="sizing-assumptions">([^<]+)</p>', html)
    assert len(assumptions) == 3 and all("framework=hf" in a for a in assumptions[:2])
    for switch in ("bf16 mixed precision", "Gradient checkpointing", "8-bit optimizer",
                   "Gradient accumulation", "QLoRA instead of LoRA"):
        assert switch in html


def test_tables_follow_live_prices(client, catalog):
    from inventory.models import Offer

    Offer.objects.filter(slug="rtx-a5000").update(monthly_cents=12345)
    assert "$123.45" in client.get(reverse("sizing_tables")).content.decode()


def test_faq_figures_are_engine_whole_gb():
    f = faq_vram_figures()
    assert set(f) == {"q7", "l7", "f7", "q70", "l70"}
    assert all(isinstance(v, int) for v in f.values())
    assert f["q7"] < f["l7"] < f["f7"] and f["q70"] < f["l70"]
    assert abs(f["q70"] - 51) / 51 <= 0.15 and abs(f["l7"] - 21) / 21 <= 0.15


def test_bar_geometry_scales_to_the_card():
    g = bar_geometry({"a": 30.0, "b": 10.0, "c": 0.0}, 40.0, 80)
    assert [s["key"] for s in g["segments"]] == ["a", "b"]
    assert g["card_x"] > g["usable_x"] > g["segments"][-1]["x"] + g["segments"][-1]["w"]
    assert g["fits"] and not bar_geometry({"a": 79.0}, 79.0, 80)["fits"]


_junk = st.one_of(st.text(max_size=10), st.integers(-10**12, 10**12).map(str),
                  st.sampled_from(["llama-2-7b", "lora", "3", "on", "off", "any", "DFW-1"]))


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(list(SizingForm.base_fields)), _junk, max_size=6))
def test_random_page_queries_never_500(client, catalog, query):
    r = client.get(reverse("sizing") + "?" + urlencode(query), HTTP_HX_REQUEST="true")
    assert r.status_code in (200, 400)
