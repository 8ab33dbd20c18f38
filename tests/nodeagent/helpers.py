"""Plain helpers the node agent's tests share: stand-in GPUs and desired-state items for the
converger, a runtime that records its calls, the burn-in's stub tools and runner, an
instance spec for the Docker runtime. Fixtures are in conftest.py."""
import threading
from pathlib import Path

from nodeagent.burnin import BurnInRunner
from nodeagent.interfaces import GpuInfo, InstanceSpec
from nodeagent.journal import Journal
from nodeagent.outbox import Outbox
from nodeagent.signing import NodeKey

from .agent_process import IMAGE_SLUG, STUB_GPUS

GPUS = [GpuInfo(index=i, uuid=uuid, name="stand-in", memory_mb=1, driver="", cuda="",
                temperature_c=None, ecc_uncorrected=0, xid_errors=(), healthy=True)
        for i, uuid in enumerate(STUB_GPUS)]


class RecordingRuntime:
    """The real runtime, with a log of the state-changing calls made to it."""

    def __init__(self, runtime):
        self.runtime, self.calls = runtime, []

    def __getattr__(self, name):
        method = getattr(self.runtime, name)
        if not name.startswith("ensure_"):
            return method

        def recorded(*args):
            self.calls.append(name)
            return method(*args)
        return recorded


def desired(lease_id, op_id, want="running", image=IMAGE_SLUG, gpus=(0, 1)):
    return {"lease_id": lease_id, "op_id": op_id, "want": want, "disk": "keep",
            "gpus": list(gpus), "image": image, "ssh_authorized_keys": ["ssh-ed25519 AAAA a"],
            "disk_gb": 10, "cpus": 1, "memory_gb": 1, "shm_gb": 1}


STUB_DIR = Path(__file__).parent / "dcgmi_stub"
DCGMI = str(STUB_DIR / "dcgmi")


class Cards:
    """Two cards; `ecc_after_test` makes GPU 1's counter move during its diagnostic."""

    def __init__(self):
        self.readings = {i: {"ecc_uncorrected": 0, "recovery_action": 0,
                             "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16},
                             "remapped_rows": {"correctable": 0, "uncorrectable": 0}} for i in (0, 1)}

    def inventory(self):
        return [GpuInfo(index=i, uuid=f"GPU-{i}", name="H100", memory_mb=81559, driver="550.54.15",
                        cuda="12.4", temperature_c=40, ecc_uncorrected=r["ecc_uncorrected"], xid_errors=(),
                        healthy=True, readings=dict(r)) for i, r in self.readings.items()]


def runner(tmp_path, diagnostics, probe=None):
    key = NodeKey.generate(tmp_path / "key.pem")
    outbox = Outbox(tmp_path / "outbox.json")
    return BurnInRunner(node="n1", key=key, outbox=outbox, journal=Journal(tmp_path / "burn-in.json"),
                        probe=probe or Cards(), diagnostics=diagnostics,
                        bandwidth=lambda uuid: {"h2d_gbps": 52.0, "bytes": 2 ** 31}), key, outbox


def wait_idle(r, timeout=30):
    done = threading.Event()
    for _ in range(int(timeout * 20)):
        if r.idle():
            return
        done.wait(0.05)
    raise AssertionError("burn-in did not finish")


GPU_UUIDS = ("GPU-5ca1ab1e-0000-4000-8000-000000000000",
             "GPU-5ca1ab1e-0000-4000-8000-000000000001")


def spec_for(lease_id, image, disk, keys=("ssh-ed25519 AAAAC3Nza alice",), gpus=GPU_UUIDS):
    return InstanceSpec(lease_id=lease_id, image=image, gpu_uuids=tuple(gpus),
                        ssh_authorized_keys=tuple(keys), cpus=1, memory_gb=1, shm_gb=1,
                        disk_path=disk)
