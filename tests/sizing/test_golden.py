"""Presentation only: the calculator's htmx fragment and full page render byte-for-byte what
they rendered before the calculator's speed work (golden files written by the code at commit
"golden fragments"), for a set of inputs, in English and in Chinese.

These goldens guard the markup, wording and layout; they are not evidence that any figure
is right — ``SIZING_WRITE_GOLDEN=1`` rewrites them from whatever the engine computes. The
figures are pinned against hand-derived arithmetic elsewhere: each engine term in
tests/sizing/engine/test_terms_by_hand.py, the SPEC's tables in tests/sizing/engine/test_vram_rules.py.

Regenerate only on purpose, when the page's content is meant to change:
``SIZING_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/sizing/test_golden.py``.
"""

import os
import re
from pathlib import Path
from urllib.parse import urlencode

import pytest

GOLDEN = Path(__file__).parent / "golden"
CONFIGS = Path(__file__).parent / "configs"
WRITE = os.environ.get("SIZING_WRITE_GOLDEN") == "1"
LANGS = {"en": "en-US,en;q=0.9", "zh": "zh-Hans,zh;q=0.9,en;q=0.5"}

CASES = {
    "default": "",
    "70b-lora": "model=llama-2-70b&method=lora",
    "7b-qlora-long": "model=llama-2-7b&method=qlora&seq=8192&checkpointing=off&tokens=20000000",
    "34b-lora-rocm-site": "model=codellama-34b&method=lora&vendor=any&site=DFW-1",
    "mixtral-torchtune": "model=mixtral-8x7b&method=qlora&framework=torchtune&batch=2",
    "7b-full-zero3": "model=llama-2-7b&method=full&gpus=2&zero=3&in_stock=on&tokens=5000000&epochs=2",
    "nothing-fits": "params=900&method=full",
    "bad-input": "seq=abc&gpus=99",
    "llava-config": urlencode({"config": (CONFIGS / "llava-1.5-7b-hf.json").read_text(), "method": "lora"}),
}
#: the full page carries a per-session CSRF token; it is masked before comparing
CSRF = re.compile(r'(csrfmiddlewaretoken" value="|"X-CSRFToken": ")[^"]+')


def _main(html: str) -> str:
    """The page's own content (base.html's <main>): the shell around it belongs to other
    pages' work and is not what these goldens guard."""
    return CSRF.sub(r"\1<csrf>", html[html.index('<main id="main"'):html.index("</main>")])


@pytest.fixture
def demo(db):
    from inventory.demo import load_demo_catalog

    load_demo_catalog()


def _check(name: str, body: str) -> None:
    path = GOLDEN / name
    if WRITE:
        path.write_text(body, encoding="utf-8")
    assert body == path.read_text(encoding="utf-8"), name


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("case", CASES)
def test_fragment_unchanged(client, demo, case, lang):
    r = client.get(f"/size/?{CASES[case]}", HTTP_HX_REQUEST="true", HTTP_ACCEPT_LANGUAGE=LANGS[lang])
    assert r.status_code == (400 if case == "bad-input" else 200)
    _check(f"{case}.{lang}.fragment.html", r.content.decode())


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("case", ["default", "70b-lora", "bad-input"])
def test_full_page_unchanged(client, demo, case, lang):
    r = client.get(f"/size/?{CASES[case]}", HTTP_ACCEPT_LANGUAGE=LANGS[lang])
    _check(f"{case}.{lang}.page.html", _main(r.content.decode()))


@pytest.mark.parametrize("lang", LANGS)
def test_tables_page_unchanged(client, demo, lang):
    r = client.get("/size/tables/", HTTP_ACCEPT_LANGUAGE=LANGS[lang])
    _check(f"tables.{lang}.page.html", _main(r.content.decode()))
