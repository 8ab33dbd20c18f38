"""The recommendation speaks plainly: one-change plans with price and trade-off, the plan's
figure as the headline, overbuy on the recommended row, checkpoints named for what they hold."""

import re

import pytest

from sizing.alternatives import one_change_alternatives
from sizing.engine import Job
from sizing.presets import PRESETS
from sizing.recommend import recommend


@pytest.fixture
def demo(db):
    from inventory.demo import load_demo_catalog

    load_demo_catalog()


def test_70b_lora_api_names_the_cheaper_one_change_plans(client, demo):
    d = client.get("/api/v1/estimate", {"model": "llama-2-70b", "method": "lora"}).json()
    plan = d["plan"]
    assert plan["offer"] == "8x-h100-sxm" and plan["mode"] == "zero-3" and plan["gpus"] == 8
    assert plan["per_gpu_gb"] < 40 < d["per_gpu_gb"]  # the plan's figure, not the 1-GPU one
    assert abs(sum(plan["breakdown_gb"].values()) - plan["per_gpu_gb"]) < 0.05
    changes = {c["change"]: c for c in d["one_change"]}
    assert changes["vendor"]["offer"] == "mi300x" and changes["vendor"]["monthly_usd"] == 1590
    assert changes["qlora"]["offer"] == "a100-sxm" and changes["qlora"]["monthly_usd"] == 990
    assert changes["qlora"]["query"] == {"method": "qlora"} and "slower" in changes["qlora"]["tradeoff"]
    assert "ROCm" in changes["vendor"]["tradeoff"]
    assert [c["monthly_usd"] for c in d["one_change"]] == sorted(c["monthly_usd"] for c in d["one_change"])
    best = d["recommendations"][0]
    # No "fits on 3× H100" advice: the catalog has no 3× (or 2×, 4×) H100 offer.
    assert best["offer"] == "8x-h100-sxm" and not any("ZeRO-3 fits this job on" in w for w in best["warnings"])


def test_70b_lora_page_headline_is_the_plan(client, demo):
    html = client.get("/size/", {"model": "llama-2-70b", "method": "lora"}).content.decode()
    summary = html.split('class="sizing-summary"')[1].split("</section>")[0]
    plan_gb = re.search(r'Per GPU, recommended plan</dt><dd class="big">([\d.,]+) <small>', summary).group(1)
    assert float(plan_gb) < 40
    assert "Plan: 8× H100 SXM, zero-3 (ZeRO-3)." in summary
    assert re.search(r"As you configured it \(1 GPU, ZeRO-0\) the job needs 1\d\d\.\d GB per GPU", summary)
    changes = html.split('class="catalog sizing-changes"')[1].split("</table>")[0]
    assert "ROCm allowed (AMD cards too)" in changes and "$1,590" in changes
    assert "QLoRA instead of LoRA" in changes and "$990" in changes
    best_row = html.split('<tr class="best">')[1].split("</tr>")[0]
    assert "3× H100 SXM" not in html and "ZeRO-3 fits this job on" not in best_row  # no such offer


def test_full_fine_tune_offers_lora_and_8bit(catalog):
    job = Job(PRESETS["llama-2-13b"], "full")
    rec = recommend(job, catalog, vendor="any")
    keys = {c.key: c for c in one_change_alternatives(job, catalog, vendor="any", site=None,
                                                      in_stock=False, best=rec.best)}
    assert "vendor" not in keys  # ROCm already allowed
    assert keys["optimizer-8bit"].option.candidate.monthly_cents < rec.best.candidate.monthly_cents
    assert keys["lora"].option.estimate.method == "lora"
    for ch in keys.values():
        assert ch.option.candidate.monthly_cents < rec.best.candidate.monthly_cents and ch.tradeoff


def test_no_change_shown_when_nothing_is_cheaper(catalog):
    job = Job(PRESETS["llama-2-7b"], "qlora")
    rec = recommend(job, catalog, vendor="any")
    assert rec.best.candidate.offer_slug == "rtx-a5000"
    assert one_change_alternatives(job, catalog, vendor="any", site=None, in_stock=False, best=rec.best) == []


def test_sharded_rows_say_the_trade_off(catalog):
    rec = recommend(Job(PRESETS["llama-2-7b"], "full"), catalog)
    assert rec.best.mode == "zero-3" and "1.5× the traffic" in rec.best.reason


def test_checkpoint_sizes_are_named_for_what_they_hold(client, demo):
    lora = client.get("/size/", {"model": "llama-2-7b", "method": "lora"}).content.decode()
    ckpt = lora.split('class="sizing-ckpt"')[1].split("</ul>")[0]
    assert "Resume checkpoint: adapter + its optimizer states (the frozen base is not saved)" in ckpt
    assert "Adapter alone, fp32 (what you ship)" in ckpt and "Adapter merged into the base" in ckpt
    full = client.get("/size/", {"model": "llama-2-7b", "method": "full"}).content.decode()
    ckpt = full.split('class="sizing-ckpt"')[1].split("</ul>")[0]
    assert "Resume checkpoint: bf16 weights + fp32 master copy + optimizer states: <strong>107.81 GB" in ckpt
    assert "Adapter" not in ckpt
