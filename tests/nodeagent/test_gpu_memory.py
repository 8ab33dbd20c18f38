"""GPU memory between tenants (nodeagent/gpu_memory.py): the clearing routine's real code
runs against the stub libcuda (cuda_stub/: every device starts holding a tenant's bytes and
reports, at exit, how many of them are left); a clear that fails is recorded and keeps the
card from passing its next burn-in; a released lease's key_destroyed evidence carries
what was cleared. No GPU here: on a real one this is still to be proven (README)."""
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.burnin import BurnInConfig, BurnInRunner, Diagnostics
from nodeagent.converge import Converger
from nodeagent.directory_disks import DirectoryDisks
from nodeagent.gpu_bandwidth import measure
from nodeagent.gpu_memory import GpuMemory, GpuMemoryConfig
from nodeagent.interfaces import GpuInfo, InstanceStatus
from nodeagent.journal import Journal
from nodeagent.outbox import Outbox
from nodeagent.signing import NodeKey
from tests import deadlines

from .agent_process import STUB_GPUS, agent_env

STUB_MEMORY = 64 * 1024 ** 2           # cuda_stub's default per device
STUB_RESERVED = 1024 ** 2              # of which the driver keeps this (never handed out)
HEALTHY = {"pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}, "recovery_action": 0,
           "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False}}
GPUS = [GpuInfo(index=i, uuid=uuid, name="stand-in", memory_mb=64, driver="", cuda="",
                temperature_c=None, ecc_uncorrected=0, xid_errors=(), healthy=True, readings=HEALTHY)
        for i, uuid in enumerate(STUB_GPUS)]


@pytest.fixture
def stub_env(nvml_stub, tmp_path) -> dict:
    """The environment the agent runs the routine in, with the stub libcuda; its report
    file collects what each run left in the devices' memory."""
    env = agent_env(nvml_stub)
    env["CUDA_STUB_REPORT"] = str(tmp_path / "cuda-stub-report")
    return env


def stub_report(env) -> list[tuple[str, int, int]]:
    """(uuid, allocatable bytes, of those not zero) per device per routine run."""
    path = Path(env["CUDA_STUB_REPORT"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [(u, int(b.split("=")[1]), int(n.split("=")[1])) for u, b, n in (line.split() for line in lines)]


def gpu_memory(tmp_path, env, **config) -> GpuMemory:
    return GpuMemory(GpuMemoryConfig(**config), tmp_path / "gpu-memory.json",
                     run=functools.partial(subprocess.run, env=env))


def test_the_routine_overwrites_every_byte_it_can_allocate(stub_env):
    done = subprocess.run([sys.executable, "-m", "nodeagent.gpu_memory", "clear", STUB_GPUS[1]],
                          env=stub_env, capture_output=True, text=True, timeout=deadlines.scaled(60))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["verified"] and report["nonzero"] == 0 and report["samples"] > 0
    assert report["bytes"] == STUB_MEMORY - STUB_RESERVED and report["total_bytes"] == STUB_MEMORY
    # the stub's own count: not one byte of the tenant's left where the routine could reach
    assert stub_report(stub_env) == [(STUB_GPUS[1], STUB_MEMORY - STUB_RESERVED, 0)]


def test_memory_that_does_not_read_back_as_zeros_is_not_verified(stub_env):
    stub_env["CUDA_STUB_FAULT"] = "memset"                 # the write never lands
    done = subprocess.run([sys.executable, "-m", "nodeagent.gpu_memory", "clear", STUB_GPUS[0]],
                          env=stub_env, capture_output=True, text=True, timeout=deadlines.scaled(60))
    report = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 1 and not report["verified"] and report["nonzero"] > 0
    assert stub_report(stub_env)[0][2] == STUB_MEMORY - STUB_RESERVED


@pytest.mark.parametrize("fault, detail", [
    ("memset", "non-zero bytes read back"),
    ("init", "CUDA error 100"),
    ("hang", "did not finish in 2s"),
])
def test_a_failed_clear_is_recorded_with_its_reason(stub_env, tmp_path, fault, detail):
    stub_env["CUDA_STUB_FAULT"] = fault
    entry = gpu_memory(tmp_path, stub_env, timeout_seconds=2).clear(STUB_GPUS[0])
    assert entry["result"] == "failed" and not entry["verified"] and detail in entry["detail"]


def test_a_released_lease_has_each_gpu_it_held_cleared_once_also_across_a_restart(stub_env, tmp_path):
    first = gpu_memory(tmp_path, stub_env)
    first.hold(7, [STUB_GPUS[0]])
    first.hold(7, list(STUB_GPUS))                         # recreated with both: both held
    restarted = gpu_memory(tmp_path, stub_env)            # the agent restarted before the release
    results = restarted.release(7)
    assert set(results) == set(STUB_GPUS)
    assert all(r["result"] == "ok" and r["verified"] and r["bytes"] == STUB_MEMORY - STUB_RESERVED
               for r in results.values())
    assert sorted(u for u, _, nonzero in stub_report(stub_env) if nonzero == 0) == sorted(STUB_GPUS)
    again = gpu_memory(tmp_path, stub_env)
    assert again.release(7) == results and len(stub_report(stub_env)) == 2   # not run twice
    assert again.results(7) == results
    again.forget(7)
    assert gpu_memory(tmp_path, stub_env).results(7) == {}


def test_a_gpu_another_instance_runs_on_is_recorded_uncleared_and_not_touched(stub_env, tmp_path):
    memory = gpu_memory(tmp_path, stub_env)
    memory.hold(8, [STUB_GPUS[0]])
    [entry] = memory.release(8, in_use={STUB_GPUS[0]: 9}).values()
    assert entry["result"] == "failed" and "lease 9's instance had this GPU" in entry["detail"]
    assert stub_report(stub_env) == []                     # its tenant's memory left alone


def test_a_card_whose_memory_was_not_cleared_fails_burn_in_until_a_clear_succeeds(stub_env, tmp_path):
    stub_env["CUDA_STUB_FAULT"] = "memset"
    memory = gpu_memory(tmp_path, stub_env)
    memory.hold(3, [STUB_GPUS[1]])
    assert memory.release(3)[STUB_GPUS[1]]["result"] == "failed"

    class Cards:
        def inventory(self):
            return GPUS

    key = NodeKey.generate(tmp_path / "key.pem")
    outbox = Outbox(tmp_path / "outbox.json")
    runner = BurnInRunner(node="n1", key=key, outbox=outbox, journal=Journal(tmp_path / "burn-in.json"),
                          probe=Cards(), gpu_memory=gpu_memory(tmp_path, stub_env),
                          bandwidth=lambda uuid: measure(uuid, run=functools.partial(subprocess.run, env={
                              k: v for k, v in stub_env.items() if k != "CUDA_STUB_REPORT"})),
                          diagnostics=Diagnostics(BurnInConfig(dcgmi="no-such-dcgmi", fallback_command=["true"])))

    def burn_in(op_id) -> dict:
        runner.submit([{"op_id": op_id, "gpu": 1, "level": 2}], busy_gpus=set())
        return deadlines.wait_for(lambda: next((r for r in outbox.pending() if r["op_id"] == op_id), None),
                                  60, f"burn-in {op_id}")

    still = burn_in("burnin:2:1")                          # cleared again first: fails again
    assert still["result"] == "fail" and still["tool"] == "gpu_memory"
    assert "GPU memory not cleared" in still["detail"]
    del stub_env["CUDA_STUB_FAULT"]                        # the operator fixed the card
    fixed = burn_in("burnin:2:2")
    assert fixed["result"] == "pass" and fixed["tool"] == "fallback"
    assert stub_report(stub_env)[-1] == (STUB_GPUS[1], STUB_MEMORY - STUB_RESERVED, 0)


class Instances:
    """A runtime that only keeps states (what converge needs of one), in call order."""

    def __init__(self):
        self.states, self.calls = {}, []

    def status(self, lease_id):
        state = self.states.get(lease_id, "absent")
        return InstanceStatus(lease_id=lease_id, state=state, ssh_port=22000 + lease_id if state != "absent" else None)

    def ensure_running(self, spec):
        self.calls.append(("running", spec.lease_id))
        self.states[spec.lease_id] = "running"
        return self.status(spec.lease_id)

    def ensure_stopped(self, lease_id):
        self.states[lease_id] = "stopped"
        return self.status(lease_id)

    def ensure_absent(self, lease_id):
        self.calls.append(("absent", lease_id))
        self.states.pop(lease_id, None)
        return self.status(lease_id)

    def lease_ids(self):
        return sorted(self.states)

    def unpause_all(self, *, except_leases):
        return []


def item(lease_id, op_id, want="running", disk="keep", gpus=(0, 1)):
    return {"lease_id": lease_id, "op_id": op_id, "want": want, "disk": disk, "gpus": list(gpus),
            "image": "img", "ssh_authorized_keys": [], "disk_gb": 1, "cpus": 1, "memory_gb": 1, "shm_gb": 1}


def test_the_release_evidence_says_what_was_cleared_and_the_next_tenant_starts_after_it(stub_env, tmp_path):
    runtime, outbox = Instances(), Outbox(tmp_path / "outbox.json")
    converger = Converger(node="n1", runtime=runtime, disks=DirectoryDisks(tmp_path / "disks"),
                          journal=Journal(tmp_path / "journal.json"), outbox=outbox,
                          key=NodeKey.generate(tmp_path / "key.pem"), images={"img": "img:1"},
                          public_host="192.0.2.10", gpu_memory=gpu_memory(tmp_path, stub_env))
    converger.converge([item(11, "11:running:1")], GPUS)
    assert stub_report(stub_env) == []                     # nothing cleared while it runs
    # lease 11 released, lease 12 given GPU 1 and listed first: 11's GPUs are cleared before 12 starts
    reports = converger.converge([item(12, "12:running:1", gpus=(1,)),
                                  item(11, "11:destroy_key:2", want="absent", disk="destroy_key")], GPUS)
    assert [r["lease_id"] for r in reports] == [12, 11] and all(r["error"] is None for r in reports)
    assert runtime.calls == [("running", 11), ("absent", 11), ("running", 12)]
    [destroyed] = [e for e in outbox.pending() if e["kind"] == "key_destroyed"]
    cleared = destroyed["gpu_memory_cleared"]
    assert set(cleared) == set(STUB_GPUS)
    assert all(c["result"] == "ok" and c["verified"] and c["method"] == "cuda-memset-zero"
               and c["bytes"] == STUB_MEMORY - STUB_RESERVED and c["total_bytes"] == STUB_MEMORY
               for c in cleared.values())
    assert sorted(u for u, _, nonzero in stub_report(stub_env) if nonzero == 0) == sorted(STUB_GPUS)


def test_a_failed_clear_is_in_the_release_evidence_and_does_not_hold_up_the_disk(stub_env, tmp_path):
    stub_env["CUDA_STUB_FAULT"] = "init"
    outbox = Outbox(tmp_path / "outbox.json")
    converger = Converger(node="n1", runtime=Instances(), disks=DirectoryDisks(tmp_path / "disks"),
                          journal=Journal(tmp_path / "journal.json"), outbox=outbox,
                          key=NodeKey.generate(tmp_path / "key.pem"), images={"img": "img:1"},
                          public_host="192.0.2.10", gpu_memory=gpu_memory(tmp_path, stub_env))
    converger.converge([item(13, "13:running:1", gpus=(0,))], GPUS)
    [report] = converger.converge([item(13, "13:destroy_key:2", want="absent", disk="destroy_key")], GPUS)
    assert report["state"] == "absent" and report["error"] is None
    [destroyed] = [e for e in outbox.pending() if e["kind"] == "key_destroyed"]
    entry = destroyed["gpu_memory_cleared"][STUB_GPUS[0]]
    assert entry["result"] == "failed" and "CUDA error 100" in entry["detail"]
