"""Burn-in by card class and the checks of every level (nodeagent/gpu_checks.py,
docs/adr/0013-burn-in-by-card-class.md): the rules as a Hypothesis property over readings,
the NVML readings they need through pynvml against the stub libnvidia-ml (a card failing
each check), the bandwidth routine against the stub libcuda, and the plan each class gets.
No GPU here: the stubs answer in the real libraries' formats."""
import json
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.burnin import BurnInConfig, Diagnostics
from nodeagent.gpu_bandwidth import measure
from nodeagent.gpu_checks import (
    DATACENTER,
    GEFORCE,
    UNKNOWN,
    WORKSTATION,
    Limits,
    card_class,
    checks,
    link_peak_gbps,
    plan,
)

from .helpers import DCGMI, Cards, runner, wait_idle

LIMITS = Limits(min_h2d_fraction=0.6, max_remapped_rows=8, max_retired_pages=10)

readings_strategy = st.fixed_dictionaries({
    "recovery_action": st.sampled_from([None, 0, 0, 1, 2, 4]),
    "retired_pages_pending": st.booleans(),
    "remapped_rows": st.fixed_dictionaries({
        "correctable": st.integers(0, 12), "uncorrectable": st.integers(0, 3),
        "pending": st.booleans(), "failed": st.booleans()}),
    "retired_pages": st.fixed_dictionaries({"single_bit": st.integers(0, 8), "double_bit": st.integers(0, 8)}),
    "pcie": st.fixed_dictionaries({"gen": st.integers(1, 5), "max_gen": st.integers(1, 5),
                                   "width": st.sampled_from([1, 4, 8, 16]), "max_width": st.sampled_from([8, 16])}),
    "clock_event_reasons": st.sampled_from([0, 1]),
})


@settings(max_examples=300, deadline=None)
@given(readings_strategy, st.floats(0.5, 70, allow_nan=False))
def test_every_check_fails_exactly_on_its_rule(r, gbps):
    found = {c["name"]: c for c in checks(r, {"h2d_gbps": gbps, "bytes": 1}, LIMITS)}
    remap, pcie = r["remapped_rows"], r["pcie"]
    recovery_pending = r["recovery_action"] not in (None, 0) or remap["pending"] or r["retired_pages_pending"]
    link_low = pcie["width"] < pcie["max_width"] or (pcie["gen"] < pcie["max_gen"] and not r["clock_event_reasons"])
    peak = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}[pcie["max_gen"]] * pcie["max_width"]
    slow = gbps / peak < 0.6 - 1e-3 if abs(gbps / peak - 0.6) > 1e-3 else None    # rounding edge: skip
    rows_over = remap["failed"] or remap["correctable"] + remap["uncorrectable"] > 8 or \
        sum(r["retired_pages"].values()) > 10
    assert (found["recovery_action"]["status"] == "fail") == recovery_pending
    assert (found["pcie_link"]["status"] == "fail") == link_low
    if slow is not None:
        assert (found["h2d_bandwidth"]["status"] == "fail") == slow
    assert (found["memory_rows"]["status"] == "fail") == rows_over
    for check in found.values():        # each verdict carries its figures, a failure its reason
        assert check["figures"] and (check["status"] == "pass") == (check["detail"] == "")
    assert found["h2d_bandwidth"]["figures"]["peak_gbps"] == round(peak, 3)


def test_a_card_without_readings_or_a_measurement_fails_rather_than_passes():
    found = {c["name"]: c["status"] for c in checks({}, None, LIMITS)}
    assert found["pcie_link"] == "fail" and found["h2d_bandwidth"] == "fail"
    error = checks({"pcie": {"max_gen": 5, "max_width": 16}}, {"error": "no libcuda"}, LIMITS)[2]
    assert error["status"] == "fail" and "no libcuda" in error["detail"]


def test_each_class_gets_its_plan():
    assert card_class(14, "NVIDIA H100 80GB HBM3") == DATACENTER
    assert card_class(5, "NVIDIA GeForce RTX 4090") == GEFORCE
    assert card_class(13, "NVIDIA RTX A6000") == WORKSTATION
    assert card_class(None, "NVIDIA GeForce RTX 3090") == GEFORCE
    assert card_class(None, "mystery") == UNKNOWN
    assert (plan(DATACENTER, "deep").dcgm_level, plan(DATACENTER, "deep").fallback) == (3, False)
    assert (plan(DATACENTER, "short").dcgm_level, plan(DATACENTER, "short").fallback) == (1, False)
    for card in (GEFORCE, WORKSTATION):
        assert all((plan(card, d).dcgm_level, plan(card, d).fallback) == (1, True) for d in ("deep", "short"))
    assert plan(UNKNOWN, "deep").fallback and plan(UNKNOWN, "deep").dcgm_level == 3
    assert link_peak_gbps(4, 16) == 31.504 and link_peak_gbps(None, 16) is None


def test_a_geforce_card_runs_level_1_and_fails_without_the_fallback(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("DCGMI_STUB_LOG", str(calls))
    cards = Cards()
    cards.readings[0]["brand"] = 5                          # GeForce
    r, _, outbox = runner(tmp_path, Diagnostics(BurnInConfig(dcgmi=DCGMI)), probe=cards)
    r.submit([{"op_id": "b:1", "gpu": 0, "depth": "deep"}, {"op_id": "b:2", "gpu": 1, "depth": "deep"}],
             busy_gpus=set())
    wait_idle(r)
    geforce, datacenter = outbox.pending()
    assert calls.read_text().splitlines() == ["diag -r 1 -j -i 0", "diag -r 3 -j -i 1"]
    assert geforce["result"] == "fail" and geforce["card_class"] == "geforce" and geforce["fallback"]
    assert "needs the fallback" in geforce["detail"]
    assert datacenter["result"] == "pass" and datacenter["level"] == 3 and datacenter["depth"] == "deep"
    assert [c["name"] for c in datacenter["checks"]] == ["recovery_action", "pcie_link", "h2d_bandwidth",
                                                         "memory_rows"]


def test_a_passing_diagnostic_still_fails_on_a_check(tmp_path):
    cards = Cards()
    cards.readings[1]["recovery_action"] = 1               # waits for a GPU reset: DCGM would pass it
    r, _, outbox = runner(tmp_path, Diagnostics(BurnInConfig(dcgmi=DCGMI)), probe=cards)
    r.submit([{"op_id": "b:3", "gpu": 1, "depth": "short"}], busy_gpus=set())
    wait_idle(r)
    [record] = outbox.pending()
    assert record["result"] == "fail" and record["level"] == 1
    assert "recovery_action: pending: recovery action gpu_reset" in record["detail"]


PROBE = """
import json
from nodeagent.burnin import BurnInConfig
from nodeagent.gpu import open_gpu_probe
from nodeagent.gpu_checks import checks
limits = BurnInConfig().limits()
out = {}
for info in open_gpu_probe().inventory():
    found = checks(info.readings, {"h2d_gbps": 50.0}, limits)
    out[info.index] = {"brand": info.readings.get("brand"), "failed": [c["name"] for c in found if c["status"] == "fail"]}
print(json.dumps(out))
"""


def _env(nvml_stub, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVML_STUB_", "CUDA_STUB_"))}
    return {**env, "LD_LIBRARY_PATH": str(nvml_stub), **extra}


def test_nvml_readings_through_the_stub_fail_each_card_on_its_own_check(nvml_stub):
    env = _env(nvml_stub, NVML_STUB_GPUS="6", NVML_STUB_RECOVERY="1:1", NVML_STUB_PCIE_WIDTH="2:8",
               NVML_STUB_PCIE_GEN="3:3", NVML_STUB_REMAPPED="4:9", NVML_STUB_RETIRED="5:11")
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    cards = {int(k): v for k, v in json.loads(done.stdout).items()}
    assert {i: c["failed"] for i, c in cards.items()} == {
        0: [], 1: ["recovery_action"], 2: ["pcie_link"], 3: ["pcie_link"], 4: ["memory_rows"], 5: ["memory_rows"]}
    assert {c["brand"] for c in cards.values()} == {14}


def test_the_bandwidth_routine_measures_through_cuda_events_and_a_slow_link_fails(nvml_stub):
    uuid = "GPU-5ca1ab1e-0000-4000-8000-000000000001"
    peak_link = {"pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}}
    results = {}
    for gbps in ("50", "30"):
        env = _env(nvml_stub, CUDA_STUB_H2D_GBPS=gbps)
        measured = measure(uuid, run=lambda argv, **kw: subprocess.run(argv, env=env, **kw))  # noqa: B023
        assert measured["h2d_gbps"] == float(gbps) and measured["bytes"] > 0
        results[gbps] = checks(peak_link, measured, LIMITS)[2]
    assert results["50"]["status"] == "pass" and results["50"]["figures"]["fraction"] == 0.794
    assert results["30"]["status"] == "fail" and "48% of the link's 63.0 GB/s" in results["30"]["detail"]
    missing = measure("GPU-no-such", run=lambda argv, **kw: subprocess.run(argv, env=_env(nvml_stub), **kw))
    assert "no CUDA device" in missing["error"]
