"""The GPU acceptance script (scripts/gpu-acceptance.py) in CI: against the stub
libnvidia-ml, libcuda and dcgmi it runs the agent's NVML readings, the condition table, the
burn-in checks with the bandwidth routine and the fallback burn-in (PyTorch on the CPU, from
the measuring venv scripts/install-measure-tools.sh makes), and says what it read. On a real
GPU server it is run by hand (nodeagent/README.md); this proves the script, not the card."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.tools import require

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-acceptance.py"
TORCH_PYTHON = ROOT / ".venv-measure" / "bin" / "python"
DCGMI_DIR = Path(__file__).parent / "dcgmi_stub"


def acceptance(nvml_stub, *args, **env) -> tuple[int, dict]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NVML_STUB_", "CUDA_STUB_", "DCGMI_"))}
    environ.update(LD_LIBRARY_PATH=str(nvml_stub), PATH=f"{DCGMI_DIR}{os.pathsep}{environ['PATH']}", **env)
    done = subprocess.run([sys.executable, str(SCRIPT), "--json", *args], env=environ, capture_output=True,
                          text=True, timeout=240)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_acceptance_script_reads_and_tests_a_card_through_the_agents_code(nvml_stub):
    require(TORCH_PYTHON.exists(), "the measuring venv with PyTorch (scripts/install-measure-tools.sh)")
    code, out = acceptance(nvml_stub, "--gpu", "1", "--python", str(TORCH_PYTHON), "--seconds", "0.5",
                           "--fallback-args", "--allow-cpu --n 128 --max-memory-mb 128")
    assert code == 0 and out["result"] == "pass", out
    parts = out["parts"]
    assert parts["nvml"]["report"]["uuid"].endswith("000000000001")
    assert parts["nvml"]["readings"]["brand"] == 14 and parts["nvml"]["readings"]["recovery_action"] == 0
    assert parts["conditions"] == []
    assert parts["burn_in_checks"]["card_class"] == "datacenter"
    assert [c["status"] for c in parts["burn_in_checks"]["checks"]] == ["pass"] * 4
    assert parts["burn_in_checks"]["bandwidth"]["h2d_gbps"] == 50.0
    assert [t["name"] for t in parts["fallback"]["tests"]] == ["matmul", "memory pattern"]
    assert {t["status"] for t in parts["fallback"]["tests"]} == {"pass"}
    assert parts["dcgm_level_1"]["version"] == "3.3.5"


def test_a_degraded_card_and_a_missing_pytorch_are_said_plainly(nvml_stub):
    code, out = acceptance(nvml_stub, "--gpu", "0", "--python", sys.executable,
                           NVML_STUB_PCIE_WIDTH="0:8", CUDA_STUB_H2D_GBPS="20")
    assert code == 2 and out["result"] == "unable"                  # no PyTorch: not a pass
    assert out["parts"]["fallback"]["error"] == "PyTorch is not installed"
    checks = {c["name"]: c for c in out["parts"]["burn_in_checks"]["checks"]}
    assert checks["pcie_link"]["status"] == "fail" and checks["h2d_bandwidth"]["status"] == "fail"
    assert {"code": "pcie_width_degraded", "detail": "PCIe link x8 of x16", "rule": "drain"} in out["parts"]["conditions"]
