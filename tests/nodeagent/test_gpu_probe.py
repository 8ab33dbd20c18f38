"""GPU inventory through the real nvidia-ml-py code path, against the stub
libnvidia-ml.so.1 (tests/nodeagent/nvml_stub) or against no library at all."""
import json
import os
import subprocess
import sys

PROBE = """
import json
from nodeagent.gpu import gpu_report, open_gpu_probe
probe = open_gpu_probe(max_temperature_c=85)
print(json.dumps({"library": probe.library,
                  "gpus": [gpu_report(g) for g in probe.inventory()]}))
"""


def probe(lib_dir=None, **env):
    environ = {k: v for k, v in os.environ.items()
               if k != "LD_LIBRARY_PATH" and not k.startswith("NVML_STUB_")}
    if lib_dir:
        environ["LD_LIBRARY_PATH"] = str(lib_dir)
    environ.update(env)
    run = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_inventory_through_nvml(nvml_stub):
    result = probe(nvml_stub, NVML_STUB_GPUS="2")
    assert result["library"] == "nvml"
    assert [g["index"] for g in result["gpus"]] == [0, 1]
    first = result["gpus"][0]
    assert first == {"index": 0, "uuid": "GPU-5ca1ab1e-0000-4000-8000-000000000000",
                     "name": "Stub NVIDIA H100 80GB HBM3", "memory_mb": 81559,
                     "driver": "550.54.15", "cuda": "12.4", "temperature_c": 41,
                     "ecc_uncorrected": 0, "xid_errors": [], "healthy": True, "problem": ""}
    assert len({g["uuid"] for g in result["gpus"]}) == 2


def test_uncorrected_ecc_errors_make_a_gpu_unhealthy(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_GPUS="4", NVML_STUB_ECC_GPU="2")["gpus"]
    assert [g["healthy"] for g in gpus] == [True, True, False, True]
    assert gpus[2]["ecc_uncorrected"] == 3 and "ECC" in gpus[2]["problem"]


def test_critical_xid_event_makes_a_gpu_unhealthy(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_XID="1:79")["gpus"]
    assert gpus[1]["xid_errors"] == [79] and not gpus[1]["healthy"]
    assert "Xid 79" in gpus[1]["problem"]
    assert gpus[0]["healthy"] and gpus[0]["xid_errors"] == []


def test_overheating_gpu_is_unhealthy(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_TEMP="91")["gpus"]
    assert not any(g["healthy"] for g in gpus)
    assert "temperature 91 C" in gpus[0]["problem"]


def test_a_gpu_nvml_cannot_read_is_reported_unhealthy_not_a_crash(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_GPUS="3", NVML_STUB_LOST_GPU="1")["gpus"]
    assert [g["healthy"] for g in gpus] == [True, False, True]
    assert gpus[1]["uuid"] == "GPU-5ca1ab1e-0000-4000-8000-000000000001"
    assert "GPU is lost" in gpus[1]["problem"]


def test_no_gpu_library_is_a_clear_state_not_a_crash(tmp_path):
    assert probe(tmp_path) == {"library": "none", "gpus": []}
