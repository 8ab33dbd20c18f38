"""Run the installed `gpu-node-agent` console script as its own process, the way systemd
does, with the stub NVML library and a config pointing at the private dockerd."""
import os
import subprocess
import sys
from pathlib import Path

from tests import deadlines


def stub_uuid(index: int) -> str:
    """The UUID the NVML stub gives GPU `index`."""
    return f"GPU-5ca1ab1e-0000-4000-8000-{index:012d}"


STUB_GPUS = (stub_uuid(0), stub_uuid(1))
IMAGE_SLUG = "debian-12-ssh"
AGENT = Path(sys.executable).parent / "gpu-node-agent"
REPO = Path(__file__).resolve().parents[2]


def write_config(path: Path, *, state_dir: Path, dockerd, image_ref: str, public_host: str,
                 storefront_url: str = "", port_range=(22200, 22299), gpu_count: int = 2,
                 image_slugs: tuple[str, ...] = ()) -> Path:
    # stand-in device nodes of the private dockerd's /dev (tests/nodeagent/private_dev.sh)
    devices = "\n".join(f'"{stub_uuid(i)}" = "/dev/nvidia{i}"' for i in range(gpu_count))
    images = "\n".join(f'"{slug}" = "{image_ref}"' for slug in (image_slugs or (IMAGE_SLUG,)))
    url_line = f'storefront_url = "{storefront_url}"\n' if storefront_url else ""
    # The test host's kernel settings are the host's, not this test's to change: its
    # io_uring and pid_max checks (nodeagent/preflight.py) are waived, the others hold.
    path.write_text(f"""{url_line}state_dir = "{state_dir}"
public_host = "{public_host}"
disk_backend = "directory"
preflight_waive = ["io_uring", "pid_max"]

[disks]
root = "{state_dir}/disks"

[docker]
socket = "{dockerd.socket}"
gpu_mode = "devices"
port_range = [{port_range[0]}, {port_range[1]}]
stop_timeout = 2

[docker.gpu_devices]
{devices}

[images]
{images}
""")
    return path


def agent_env(nvml_stub: Path, gpu_count: int = 2) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVML_STUB_")}
    # The agent process imports this checkout's nodeagent: the console script's editable
    # install may map the package to another checkout (a worktree's .venv is shared).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["LD_LIBRARY_PATH"] = str(nvml_stub)
    env["NVML_STUB_GPUS"] = str(gpu_count)
    return env


def agent_cli(config: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(AGENT), "--config", str(config), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def start_agent(config: Path, env: dict, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "wb")
    return subprocess.Popen([str(AGENT), "--config", str(config), "run"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def wait_for(condition, *, timeout=90.0, what="condition", log_path: Path | None = None):
    def tail() -> str:
        return log_path.read_text()[-3000:] if log_path and log_path.exists() else ""

    return deadlines.wait_for(condition, timeout, what, every=0.25, detail=tail)


def stop_agent(process: subprocess.Popen) -> int:
    process.terminate()
    try:
        return process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
