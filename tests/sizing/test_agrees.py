"""The calculator agrees with itself: the tables page, the FAQ and the calculator
share one set of assumptions (the calculator's defaults), every table figure opened in the
calculator gives the same number and card, the ZeRO table's "fits an 80 GB card" follows the
calculator's per-GPU figure, advice names only offers that exist, and with a run-time
estimate the recommendation is the cheapest run, not the cheapest rent."""
import re
from html import unescape
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.urls import reverse

from sizing.engine import Job
from sizing.figures import PAGE_JOB, faq_vram_figures, zero_table
from sizing.forms import DEFAULTS
from sizing.inputs import parse_request
from sizing.presets import PRESETS
from sizing.recommend import _configure, _Estimator, recommend, run_cost


@pytest.fixture
def demo(db):
    from inventory.demo import load_demo_catalog

    load_demo_catalog()


def _api(client, query: dict) -> dict:
    response = client.get("/api/v1/estimate", query)
    assert response.status_code == 200, response.content
    return response.json()


def test_the_calculator_defaults_are_the_pages_assumptions():
    job = parse_request(DEFAULTS).job
    for key, value in PAGE_JOB.items():
        assert getattr(job, key) == value, key


def test_qwen_7b_qlora_is_the_same_figure_on_the_tables_page_and_in_the_calculator(client, demo):
    html = client.get(reverse("sizing_tables")).content.decode()
    row = html.split("qwen2.5-7b</small>")[1].split("</tr>")[0]
    link, table_gb = re.search(r'<a href="([^"]+)">([\d.]+) GB</a>', row).groups()
    query = dict(parse_qsl(urlsplit(unescape(link)).query))
    assert query["model"] == "qwen2.5-7b" and query["method"] == "qlora" and query["framework"] == "hf"
    calc = _api(client, query)
    assert f"{calc['per_gpu_gb']:.1f}" == table_gb == "16.4"  # the 11.0 vs 16.4 GB, now one figure


def test_every_table_row_opens_in_the_calculator_with_the_same_card(client, demo):
    html = client.get(reverse("sizing_tables")).content.decode()
    first = html.split('id="by-method"')[1].split("</table>")[0]
    rows = re.findall(r'<tr>\s*<th scope="row">.*?</tr>', first, flags=re.S)
    assert len(rows) == 10
    for row in rows:
        needs = re.search(r'data-label="Needs">(\d+) GB', row).group(1)
        link = re.search(r'href="(/size/\?[^"]+)" class="calc-link"', row).group(1)
        calc = _api(client, dict(parse_qsl(urlsplit(unescape(link)).query)))
        assert round(calc["total_gb"]) == int(needs), link
        card = re.search(r"data-label=\"Card\">([^<]+)", row)
        if card:
            assert calc["recommendations"][0]["offer_name"] == card.group(1).strip(), link


def test_zero_table_fits_verdict_follows_the_calculators_per_gpu_figure(client, demo):
    rows = {r["label"]: r for r in zero_table()}
    zero3 = rows["ZeRO-3"]
    calc = _api(client, zero3["query"])
    assert calc["per_gpu_gb"] == pytest.approx(zero3["per_card_gb"], abs=0.05)
    assert f"{zero3['per_card_gb']:.1f}" == "82.4"  # the 32B full fine-tune, ZeRO-3, 8 cards
    assert zero3["fits"] is False  # 82.4 GB does not fit an 80 GB card (76 GB usable)
    html = client.get(reverse("sizing_tables")).content.decode()
    zero_html = html.split('id="zero"')[1].split("</table>")[0]
    zero3_row = zero_html.split("<th scope=\"row\">ZeRO-3</th>")[1].split("</tr>")[0]
    assert "82.4 GB" in zero3_row and 'class="no"' in zero3_row
    assert rows["ZeRO-Offload"]["fits"] is True and rows["ZeRO-1"]["fits"] is False


def test_faq_figures_are_the_calculators(client, demo):
    figures = faq_vram_figures()
    for key, (model, method) in {"q7": ("llama-2-7b", "qlora"), "l70": ("llama-2-70b", "lora")}.items():
        calc = _api(client, {**DEFAULTS, "model": model, "method": method, "vendor": "any"})
        assert round(calc["per_gpu_gb"]) == figures[key]
    faq = client.get(reverse("faq")).content.decode()
    assert "FlashAttention-2" in faq and f"about {figures['q7']} GB" in faq


def test_no_advice_about_a_3x_h100_offer_that_does_not_exist(client, demo):
    d = _api(client, {"model": "llama-2-70b", "method": "lora"})
    offers = {(r["gpu"], r["gpus"]) for r in d["recommendations"]}
    text = " ".join(w for r in d["recommendations"] for w in r["warnings"]) + " ".join(d["advice"])
    for n, gpu in re.findall(r"(\d+)× ([A-Z0-9][\w ]+?)(?: \(| with|,|\.)", text):
        assert (gpu.strip(), int(n)) in offers or n == "8", (n, gpu, text)
    assert "3× H100" not in text


def test_with_a_run_time_estimate_the_cheapest_run_wins_not_the_cheapest_rent(demo):
    from inventory.selectors import sizing_candidates

    cands = sizing_candidates()
    job = Job(PRESETS["qwen2.5-7b"], "qlora", tokens=500_000_000)
    est = _Estimator(job)
    runs = {c.offer_slug: run_cost(o, job)[1] for c in cands if c.vendor == "nvidia" and (o := _configure(c, est)).fits}
    cheapest_rent = min((c for c in cands if c.offer_slug in runs), key=lambda c: c.monthly_cents).offer_slug
    assert cheapest_rent == "rtx-a5000" and runs["rtx-a5000"] == 11_000  # two weeks of A5000: $110
    assert runs["rtx-a6000"] == 8_200  # one week of A6000 does it: $82
    best = recommend(job, cands).best
    assert best.candidate.offer_slug != "rtx-a5000" and best.rental_cost_cents == min(runs.values())
    assert best.reason.startswith("cheapest run")
    no_tokens = recommend(Job(PRESETS["qwen2.5-7b"], "qlora"), cands).best
    assert no_tokens.candidate.offer_slug == "rtx-a5000"  # without a run time: cheapest rent
