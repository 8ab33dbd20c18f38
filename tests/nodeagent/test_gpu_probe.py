"""GPU inventory through the real nvidia-ml-py code path, against the stub
libnvidia-ml.so.1 (tests/nodeagent/nvml_stub) or against no library at all."""
import json
import os
import subprocess
import sys

PROBE = """
import json, os
from nodeagent.gpu import gpu_report, open_gpu_probe
probe = open_gpu_probe(max_temperature_c=85, min_cuda=os.environ.get("MIN_CUDA", ""))
rounds = int(os.environ.get("ROUNDS", "1"))
for _ in range(rounds - 1):          # earlier inventories (a fault schedule changes between)
    probe.inventory()
    if os.environ.get("BETWEEN_ROUNDS"):
        exec(os.environ["BETWEEN_ROUNDS"])
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
                     "ecc_uncorrected": 0, "xid_errors": [], "healthy": True, "problem": "",
                     "conditions": [],
                     "topology": {"pcie_gen": 5, "pcie_max_gen": 5, "pcie_width": 16,
                                  "pcie_max_width": 16, "nvlink_peers": [], "nvlink_active": 0,
                                  "mig": False}}
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


# --- Health beyond ECC, named conditions, topology --------------------------

def codes(gpu) -> list[str]:
    return [c["code"] for c in gpu["conditions"]]


def test_row_remapping_and_retired_pages_are_named_conditions(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_GPUS="3", NVML_STUB_REMAP_PENDING="0",
                 NVML_STUB_REMAP_FAILED="1", NVML_STUB_RETIRED_PENDING="2")["gpus"]
    assert codes(gpus[0]) == ["row_remap_pending"] and gpus[0]["healthy"]   # drain, not down
    assert codes(gpus[1]) == ["row_remap_failed"] and not gpus[1]["healthy"]
    assert "row remapping failed" in gpus[1]["problem"]
    assert codes(gpus[2]) == ["retired_pages_pending"] and gpus[2]["healthy"]


def test_an_application_xid_is_named_but_does_not_make_the_card_unhealthy(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_XID="1:13")["gpus"]
    assert gpus[1]["xid_errors"] == [13]
    assert codes(gpus[1]) == ["xid_application"] and gpus[1]["healthy"]
    critical = probe(nvml_stub, NVML_STUB_XID="1:79")["gpus"][1]
    assert codes(critical) == ["xid_critical"] and not critical["healthy"]


def test_nvlink_topology_and_a_link_down(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_GPUS="4", NVML_STUB_NVLINKS="4",
                 NVML_STUB_NVLINK_DOWN="2")["gpus"]
    assert [g["topology"]["nvlink_peers"] for g in gpus] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    assert [g["topology"]["nvlink_active"] for g in gpus] == [4, 4, 3, 4]
    assert [codes(g) for g in gpus] == [[], [], ["nvlink_link_down"], []]
    assert "3 of 4 NVLink links" in gpus[2]["conditions"][0]["detail"]


def test_new_nvlink_crc_errors_are_counted_between_readings(nvml_stub, tmp_path):
    faults = tmp_path / "faults"
    faults.write_text("NVML_STUB_NVLINK_CRC=0:10\n")
    gpus = probe(nvml_stub, NVML_STUB_NVLINKS="2", NVML_STUB_FAULTS=str(faults), ROUNDS="2",
                 BETWEEN_ROUNDS=f"open({str(faults)!r}, 'w').write('NVML_STUB_NVLINK_CRC=0:25\\n')")["gpus"]
    assert codes(gpus[0]) == ["nvlink_errors"] and "15 new NVLink CRC" in gpus[0]["conditions"][0]["detail"]
    assert codes(gpus[1]) == []


def test_pcie_link_clocks_mig_fabric_and_driver(nvml_stub):
    gpus = probe(nvml_stub, NVML_STUB_GPUS="4", NVML_STUB_PCIE_WIDTH="0:8", NVML_STUB_THROTTLE="1:0x40",
                 NVML_STUB_MIG="2", NVML_STUB_FABRIC="2", NVML_STUB_CUDA="12020",
                 MIN_CUDA="12.4")["gpus"]
    assert gpus[0]["topology"]["pcie_width"] == 8
    assert "pcie_width_degraded" in codes(gpus[0])
    assert "clocks_throttled_thermal" in codes(gpus[1])
    assert "mig_enabled" in codes(gpus[2]) and gpus[2]["topology"]["mig"] is True
    assert all("fabric_not_ready" in codes(g) and "driver_too_old" in codes(g) for g in gpus)
    assert all(g["healthy"] for g in gpus)      # each of these drains or warns; none is "down"


def test_a_fault_schedule_changes_what_the_running_probe_sees(nvml_stub, tmp_path):
    faults = tmp_path / "faults"
    faults.write_text("")                       # healthy when the agent started
    gpus = probe(nvml_stub, NVML_STUB_FAULTS=str(faults), ROUNDS="2",
                 BETWEEN_ROUNDS=f"open({str(faults)!r}, 'w').write('NVML_STUB_ECC_GPU=1\\n')")["gpus"]
    assert [g["healthy"] for g in gpus] == [True, False]    # injected while it ran
