"""The calculator's cold path: what was made cheaper still answers the same.

The markup itself is pinned byte for byte by tests/sizing/test_golden.py; these pin the
parts that golden files cannot see: the shared form fields, the Python-built bar's escaping
and accessible names, and the estimates shared between the answer and its one-change plans.
"""

import importlib
from dataclasses import replace

import pytest
from django.http import QueryDict
from django.utils import translation

from sizing.alternatives import one_change_alternatives
from sizing.engine import Job
from sizing.estimation import estimate
from sizing.forms import SizingForm
from sizing.presets import PRESETS
from sizing.recommend import recommend
from sizing.templatetags.sizing_tags import breakdown_rows, memory_bar

layouts_module = importlib.import_module("sizing.layouts")  # where the recommender builds its estimates


def test_forms_share_fields_but_not_their_site_choices():
    a = SizingForm(QueryDict("method=lora"), sites=["DFW-1"])
    b = SizingForm(QueryDict("method=qlora"), sites=["AMS-1", "IAD-1"])
    assert a.fields["model"] is b.fields["model"]  # shared, read-only
    assert a.fields["site"] is not b.fields["site"]
    assert [v for v, _ in a.fields["site"].choices] == ["", "DFW-1"]
    assert [v for v, _ in b.fields["site"].choices] == ["", "AMS-1", "IAD-1"]
    assert a.is_valid() and b.is_valid()
    assert (a.cleaned_data["method"], b.cleaned_data["method"]) == ("lora", "qlora")
    bad = SizingForm(QueryDict("method=nope&site=DFW-1"), sites=["DFW-1"])
    assert not bad.is_valid() and set(bad.errors) == {"method"}
    assert SizingForm(QueryDict("method=lora"), sites=["DFW-1"]).errors == {}  # no error leaks


def test_the_bar_escapes_names_and_keeps_its_accessible_titles(catalog):
    card = replace(catalog[0], gpu_name='H100 <b>"SXM"</b>')
    e = estimate(Job(PRESETS["llama-2-7b"], "lora"))
    html = memory_bar(e, card, "")
    assert "<b>" not in html and "H100 &lt;b&gt;&quot;SXM&quot;&lt;/b&gt;, 80 GB" in html
    assert html.count('role="img"') == 2  # wide and narrow
    assert 'aria-labelledby="membar-title-wide"' in html and 'id="membar-title-narrow"' in html
    assert "<title>Activations: " in html and "<figcaption>" not in html
    with translation.override("zh-hans"):
        zh = memory_bar(e, card, "")
    assert "每张 GPU 显存：" in zh and "整卡 80 GB" in zh and "<title>激活值: " in zh


def test_breakdown_rows_escape_an_unknown_term():
    assert breakdown_rows({"<x>": 1.0}) == '<tr><th scope="row">&lt;x&gt;</th><td class="num">1.00 GB</td></tr>'


@pytest.mark.parametrize("method,vendor", [("full", "cuda"), ("lora", "cuda"), ("lora", "any")])
def test_one_change_plans_share_the_answers_estimates(catalog, monkeypatch, method, vendor):
    job = Job(PRESETS["llama-2-13b"], method, seq=4096, batch=2)
    alone = one_change_alternatives(job, catalog, vendor=vendor, site=None, in_stock=False,
                                    best=recommend(job, catalog, vendor=vendor).best)
    sized = []
    monkeypatch.setattr(layouts_module, "estimate", lambda j, **kw: sized.append(j) or estimate(j, **kw))
    shared: dict = {}
    rec = recommend(job, catalog, vendor=vendor, estimates=shared)
    together = one_change_alternatives(job, catalog, vendor=vendor, site=None, in_stock=False,
                                       best=rec.best, estimates=shared)
    assert together == alone  # the same plans, prices and figures
    estimates = [key for key in shared if isinstance(key[0], int)]  # it keeps terms and sizes too
    assert len(sized) == len(estimates)  # each configuration sized once, whichever plan asked
    assert rec.estimate.warnings == estimate(job).warnings  # the job's own warnings are kept


def test_texts_are_gettexts_own_per_language_and_dropped_when_settings_change(settings):
    from django.utils.translation import gettext, ngettext, pgettext

    from sizing.texts import texts

    with translation.override("zh-hans"):
        zh = texts()
        assert zh["Offer"] == gettext("Offer") != "Offer"
        assert zh.pgettext("sizing mode", "single") == pgettext("sizing mode", "single")
        assert zh.ngettext("Total, %(n)s GPU", "Total, %(n)s GPUs", 2) == ngettext(
            "Total, %(n)s GPU", "Total, %(n)s GPUs", 2)
    with translation.override("en"):
        assert texts()["Offer"] == "Offer" and texts() is not zh
    with translation.override("zh-hans"):
        assert texts() is zh  # kept for the next input
    settings.LOCALE_PATHS = [*settings.LOCALE_PATHS]  # Django reloads its catalogues: so do we
    with translation.override("zh-hans"):
        assert texts() is not zh and texts()["Offer"] == zh["Offer"]


def test_a_plural_translation_that_does_not_format_falls_back_to_english():
    from sizing.markup import _nbt
    from sizing.texts import Texts

    tr = Texts("xx")
    with translation.override("en"):
        assert _nbt(tr, tr.ngettext("%(n)s GPU", "%(n)s GPUs", 3), 3) == "3 GPUs"
        assert _nbt(tr, tr.ngettext("%(n)s GPU", "%(n)s GPUs", 1), 1) == "1 GPU"
    broken = "%(missing)s 卡"  # a catalogue entry that does not format
    tr.english[broken] = "%(n)s GPUs"
    assert _nbt(tr, broken, 3) == "3 GPUs"  # as {% blocktranslate count %} falls back to English


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-2-70b", "mixtral-8x7b"])
@pytest.mark.parametrize("method", ["full", "full-8bit", "lora", "qlora"])
def test_the_one_change_plans_cheapest_is_the_recommendations_best(catalog, model, method):
    from sizing.recommend import cheapest

    # ties on price (two identical offers) must resolve as recommend's stable sort does
    tied = [*catalog, replace(catalog[4], offer_slug="l40s-b", offer_name="L40S (b)")]
    for tokens, vendor, gpus, zero in [(0, "cuda", 1, 0), (20_000_000, "any", 1, 0), (10**9, "cuda", 2, 3)]:
        job = Job(PRESETS[model], method, seq=4096, batch=2, tokens=tokens, gpus=gpus, zero=zero)
        for site, in_stock in [(None, False), ("DFW-1", True)]:
            best = recommend(job, tied, vendor=vendor, site=site, in_stock=in_stock).best
            assert cheapest(job, tied, vendor=vendor, site=site, in_stock=in_stock) == best


QUICK_CASES = [
    "", "model=llama-2-7b", "model=llama-2-7b&method=lora&seq=%204096%20&batch=2&in_stock=on",
    "in_stock=false", "in_stock=FALSE", "in_stock=0", "in_stock=", "in_stock=true&in_stock=false",
    "method=nope", "method=lora&method=qlora", "method=", "zero=3&gpus=2", "zero=4", "site=DFW-1",
    "site=NOPE", "site=dfw-1", "framework=bogus", "framework=unsloth", "seq=abc", "seq=1%002",
    "lora_targets=" + "q" * 200, "lora_targets=" + "q" * 201, "lora_targets=%20" + "q" * 200 + "%20",
    "config=" + "x" * 65537, "params=900&model=", "checkpointing=off&flash_attention=on",
    "checkpointing=maybe", "vendor=any&offload=all", "offload=cpu", "epochs=2.5&tokens=1e7",
]


@pytest.mark.parametrize("query", QUICK_CASES)
def test_the_fragments_quick_validation_is_the_forms(query):
    from sizing.forms import quick_engine_params

    sites = ["DFW-1", "IAD-1"]
    form = SizingForm(QueryDict(query), sites=sites)
    quick = quick_engine_params(QueryDict(query), sites)
    if form.is_valid():
        assert quick == form.engine_params()
        assert list(quick) == list(form.engine_params())
    else:
        assert quick is None


@pytest.mark.parametrize("model", ["llama-2-13b", "mixtral-8x7b", "qwen2.5-7b"])
@pytest.mark.parametrize("method", ["full", "full-8bit", "lora", "qlora"])
@pytest.mark.parametrize("framework", ["hf", "unsloth", "torchtune"])
def test_an_estimate_from_another_layouts_terms_is_the_same(model, method, framework):
    from sizing.estimation import layout_free_terms

    job = Job(PRESETS[model], method, seq=3072, batch=2, tokens=10**7, framework=framework,
              checkpointing=framework != "torchtune")
    terms = layout_free_terms(job)
    for gpus, zero, offload in [(1, 0, "none"), (2, 1, "optimizer"), (4, 2, "none"), (8, 3, "all")]:
        laid_out = replace(job, gpus=gpus, zero=zero, offload=offload)
        assert estimate(laid_out, terms=terms) == estimate(laid_out)
