"""The calculator's markup over varied inputs, byte for byte.

Renders ~600 inputs (bench/calculator_varied.py's generator, plus random GPUs, ZeRO stage,
offload, site, stock filter, tokens, framework and bad values) in English and Chinese —
the htmx fragment, and every twentieth input also as the full page with its CSRF token
masked — and the JSON API's answer to each input (GET /api/v1/estimate, both languages)
into DIR, or compares with DIR. Write with the code before a change that must
not alter the presentation, compare after (exit status 1 on any difference):

    .venv/bin/python bench/calculator_compare.py /tmp/calc-ref write
    .venv/bin/python bench/calculator_compare.py /tmp/calc-ref compare

The goldens (tests/sizing/test_golden.py) pin nine inputs; this covers the combinations a
rewrite of sizing.fragment or sizing_tags' builders can break.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calculator_varied as cv  # noqa: E402 - sets up Django (bench/sizing_page.py)
import sizing_page  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from varied_inputs import METHODS, PRESETS  # noqa: E402 - calculator_varied no longer re-exports them

LANGS = {"en": "en-US,en;q=0.9", "zh": "zh-Hans,zh;q=0.9,en;q=0.5"}
CSRF = re.compile(r'(csrfmiddlewaretoken" value="|"X-CSRFToken": ")[^"]+')


def queries() -> list[str]:
    rng = random.Random(7)
    out = cv.varied_queries(400)
    for _ in range(200):
        q = {"model": rng.choice(sorted(PRESETS)), "method": rng.choice(METHODS),
             "gpus": rng.choice((1, 2, 4, 8)), "zero": rng.choice(("0", "1", "2", "3")),
             "offload": rng.choice(("none", "optimizer", "all")), "vendor": rng.choice(("cuda", "any")),
             "seq": rng.choice(cv.SEQS), "batch": rng.choice(cv.BATCHES)}
        if rng.random() < 0.3:
            q["site"] = rng.choice(("DFW-1", "AMS-1", "FRA-1", "NOPE"))
        if rng.random() < 0.3:
            q["in_stock"] = "on"
        if rng.random() < 0.4:
            q["tokens"] = rng.choice((10**6, 2 * 10**7, 10**9))
            q["epochs"] = rng.choice((1, 2.5))
        if rng.random() < 0.1:
            q["params"] = rng.choice(("900", "0.5", "abc", "3000"))
            q.pop("model")
        if rng.random() < 0.1:
            q["framework"] = rng.choice(("torchtune", "unsloth", "axolotl", "bogus"))
        if rng.random() < 0.05:
            q["seq"] = "abc"
        out.append(urlencode(q))
    return out + ["", "params=900&method=full", "seq=abc&gpus=99"]


def main(out: Path, mode: str) -> int:
    setup_test_environment()
    call_command("migrate", verbosity=0)
    from inventory.demo import load_demo_catalog

    load_demo_catalog()
    out.mkdir(exist_ok=True)
    client, qs, bad = Client(), queries(), 0
    with override_settings(ROOT_URLCONF=sizing_page.__name__, API_REQUESTS_PER_IP_PER_MINUTE=10**9):
        for i, q in enumerate(qs):
            for lang, accept in LANGS.items():
                for kind in ("f", "p", "api") if i % 20 == 0 else ("f", "api"):
                    extra = {"HTTP_HX_REQUEST": "true"} if kind == "f" else {}
                    url = ("/api/v1/estimate?" if kind == "api" else "/size/?") + q
                    r = client.get(url, HTTP_ACCEPT_LANGUAGE=accept, **extra)
                    body = r.content.decode()
                    if kind == "p":
                        body = CSRF.sub(r"\1<csrf>", body)
                    path = out / f"{i:04d}.{lang}.{kind}.{'json' if kind == 'api' else 'html'}"
                    text = f"{r.status_code} {q}\n{body}"
                    if mode == "write":
                        path.write_text(text, encoding="utf-8")
                    elif path.read_text(encoding="utf-8") != text:
                        bad += 1
                        if bad <= 5:
                            print("differs:", path)
    print(f"{len(qs)} inputs, {bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("write", "compare"):
        raise SystemExit("usage: bench/calculator_compare.py DIR write|compare")
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
