"""The module production's web serves (storefront/wsgi.py, `scripts/start.sh web`): once loaded
in a worker it has imported every view and frozen what it loaded, so that a full collection of
CPython's cyclic collector in a web worker walks only what came after (ADR 0035)."""
import json
import os
import subprocess
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parents[2]
PROBE = """
import gc, json, sys
import storefront.wsgi
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                  "views": [m in sys.modules for m in ("rental.views", "sizing.views", "fleet.views")]}))
"""


def test_a_web_worker_freezes_what_it_loaded_with_every_view():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "storefront.test_settings"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=BASE, env=env, check=True, capture_output=True,
                         text=True, timeout=120)
    loaded = json.loads(out.stdout)
    assert loaded["views"] == [True, True, True]
    # Django, the apps, the URLconf: tens of thousands of objects, none left for the collector
    assert loaded["frozen"] > 50_000 and loaded["tracked"] < loaded["frozen"] / 100, loaded
