"""scripts/mutate.py finds each rule module's tests by the layout (tests/<app>/<module>/): every
mutated source has its mirror folder with tests in it, every extra test file it names exists, and
no test file is named twice for one module."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
mutate = importlib.util.module_from_spec(_spec)
sys.modules["mutate"] = mutate  # dataclasses look their module up
_spec.loader.exec_module(mutate)


def test_a_source_mirrors_to_its_test_folder():
    assert mutate.mirror_of("billing/ledger.py") == "tests/billing/ledger"
    assert mutate.mirror_of("billing/payments/") == "tests/billing/payments"
    assert mutate.mirror_of("sizing/engine.py") == "tests/sizing/engine"


@pytest.mark.parametrize("name", sorted(mutate.MODULES))
def test_every_module_finds_its_tests_by_path(name):
    spec = mutate.MODULES[name]
    for source in spec.sources:
        assert (ROOT / source).exists(), source
    for excluded in spec.excluded:
        assert (ROOT / excluded).is_file(), excluded
    for mirror in spec.mirrors():
        assert list((ROOT / mirror).rglob("test_*.py")), f"{name}: no tests under {mirror}/"
    for extra in spec.also:
        assert (ROOT / extra).is_file(), f"{name}: {extra} does not exist"
    tests = spec.tests()
    assert len(tests) == len(set(tests)), f"{name}: a test file named twice"
    mirrored = [t for t in tests if any(t.startswith(m + "/") for m in spec.mirrors())]
    assert [t for t in spec.also if t in mirrored] == [], f"{name}: an extra that the mirror already finds"
