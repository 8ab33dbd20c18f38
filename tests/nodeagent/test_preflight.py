"""The node's start checks (nodeagent/preflight.py): each check against fake `info` dicts
and fake /proc files; the checks against the tests' real dockerd (what they say of it
matches what an instance on it can do); and the console script refusing to enrol and to
run a node that fails one, with the fix in the message, before the storefront is asked."""
import io
import json
import logging
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from nodeagent import preflight
from nodeagent.config import ConfigError, parse_config
from tests.tools import require_tool

from .agent_process import agent_cli, agent_env, write_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_PROFILE = ROOT / "nodeagent" / "seccomp-no-io-uring.json"
PROBE_SOURCE = Path(__file__).parent / "io_uring_probe" / "io_uring_probe.c"
OLD_DOCKER = {"ServerVersion": "20.10.24+dfsg1", "Driver": "overlay2",
              "SecurityOptions": ["name=apparmor", "name=seccomp,profile=default", "name=userns"]}
NEW_DOCKER = {"ServerVersion": "27.5.1", "Driver": "overlay2", "CDISpecDirs": [],
              "SecurityOptions": ["name=seccomp,profile=builtin", "name=userns"]}


def sysctl(tmp_path, name, value) -> Path:
    path = tmp_path / name
    path.write_text(f"{value}\n")
    return path


def test_the_storage_driver_must_be_overlay2():
    assert preflight.storage_driver(OLD_DOCKER) is None
    problem = preflight.storage_driver({**OLD_DOCKER, "Driver": "btrfs"})
    assert problem.check == "storage_driver" and "btrfs" in problem.detail
    assert '"storage-driver": "overlay2"' in problem.fix and "restart docker" in problem.fix


def test_cdi_is_checked_only_when_the_config_asks_for_it_and_each_gap_names_its_fix(tmp_path):
    assert preflight.cdi(OLD_DOCKER, "nvidia") is None
    too_old = preflight.cdi(OLD_DOCKER, "cdi")
    assert "20.10.24" in too_old.detail and "Docker Engine 25" in too_old.fix
    assert 'gpu_mode = "nvidia"' in too_old.fix
    off = preflight.cdi(NEW_DOCKER, "cdi")
    assert "CDI is off" in off.detail and '"features": {"cdi": true}' in off.fix
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "other.yaml").write_text("cdiVersion: 0.5.0\nkind: vendor.example/fpga\n")
    no_spec = preflight.cdi({**NEW_DOCKER, "CDISpecDirs": [str(spec_dir), str(tmp_path / "none")]}, "cdi")
    assert "no CDI spec for nvidia.com/gpu" in no_spec.detail and "nvidia-ctk cdi generate" in no_spec.fix
    (spec_dir / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    assert preflight.cdi({**NEW_DOCKER, "CDISpecDirs": [str(spec_dir)]}, "cdi") is None


def test_io_uring_is_off_in_the_kernel_where_the_kernel_can(tmp_path):
    off, on = sysctl(tmp_path, "off", 2), sysctl(tmp_path, "on", 0)
    assert preflight.io_uring({"SecurityOptions": []}, off) is None   # seccomp does not matter then
    problem = preflight.io_uring(NEW_DOCKER, on)
    assert "kernel.io_uring_disabled is 0" in problem.detail
    assert "sysctl -w kernel.io_uring_disabled=2" in problem.fix and preflight.SYSCTL_FILE in problem.fix


def test_without_the_sysctl_dockerds_seccomp_profile_must_deny_io_uring(tmp_path):
    old_kernel = tmp_path / "no-such-sysctl"
    assert preflight.io_uring(NEW_DOCKER, old_kernel) is None           # 25+: builtin denies
    problem = preflight.io_uring(OLD_DOCKER, old_kernel)
    assert "20.10.24" in problem.detail and "allows io_uring" in problem.detail
    assert "Linux 6.6" in problem.fix and "seccomp-profile" in problem.fix
    unconfined = {**NEW_DOCKER, "SecurityOptions": ["name=seccomp,profile=unconfined"]}
    assert "without seccomp" in preflight.io_uring(unconfined, old_kernel).detail
    assert "without seccomp" in preflight.io_uring({**NEW_DOCKER, "SecurityOptions": []}, old_kernel).detail

    shipped = {**OLD_DOCKER, "SecurityOptions": [f"name=seccomp,profile={SHIPPED_PROFILE}"]}
    assert preflight.io_uring(shipped, old_kernel) is None
    permissive = json.loads(SHIPPED_PROFILE.read_text())
    permissive["syscalls"].append({"names": ["io_uring_setup", "io_uring_enter"], "action": "SCMP_ACT_ALLOW"})
    (tmp_path / "permissive.json").write_text(json.dumps(permissive))
    custom = {**OLD_DOCKER, "SecurityOptions": [f"name=seccomp,profile={tmp_path / 'permissive.json'}"]}
    problem = preflight.io_uring(custom, old_kernel)
    assert "does not deny io_uring_enter, io_uring_setup" in problem.detail
    missing = {**OLD_DOCKER, "SecurityOptions": [f"name=seccomp,profile={tmp_path / 'gone.json'}"]}
    assert preflight.io_uring(missing, old_kernel) is not None         # unreadable: not trusted


def test_the_shipped_profile_denies_io_uring_and_still_runs_a_normal_program():
    assert preflight.profile_allows(SHIPPED_PROFILE, preflight.IO_URING_SYSCALLS) == []
    ordinary = ("read", "write", "openat", "execve", "clone", "mmap", "futex", "exit_group")
    assert preflight.profile_allows(SHIPPED_PROFILE, ordinary) == sorted(ordinary)


def test_pid_max_holds_every_instances_pids_limit_and_the_node(tmp_path):
    big = sysctl(tmp_path, "big", preflight.PID_MAX_SET_BY_INSTALLER)
    assert preflight.pid_max(32768, 8, big) is None
    needed = 2 * 32768 + preflight.NODE_PID_RESERVE
    exact = sysctl(tmp_path, "exact", needed)
    assert preflight.pid_max(32768, 2, exact) is None
    problem = preflight.pid_max(32768, 2, sysctl(tmp_path, "short", needed - 1))
    assert f"below the {needed}" in problem.detail and "sysctl -w kernel.pid_max=4194304" in problem.fix
    # a node without GPUs still runs (at most) one instance's worth
    assert preflight.pid_max(32768, 0, sysctl(tmp_path, "one", 32768 + preflight.NODE_PID_RESERVE)) is None
    assert "unlimited" in preflight.pid_max(0, 2, big).detail


def test_swap_is_off_in_ram_or_encrypted(tmp_path):
    header = "Filename\tType\tSize\tUsed\tPriority\n"
    sys_block = tmp_path / "block"
    (sys_block / "dm-0" / "dm").mkdir(parents=True)
    (sys_block / "dm-0" / "dm" / "uuid").write_text("CRYPT-PLAIN-swap\n")
    (sys_block / "dm-1" / "dm").mkdir(parents=True)
    (sys_block / "dm-1" / "dm" / "uuid").write_text("LVM-abc\n")
    assert preflight.swap(sysctl(tmp_path, "none", header), sys_block) is None
    ram_and_crypt = header + "/dev/zram0\tpartition\t8G\t0\t100\n/dev/dm-0\tpartition\t8G\t0\t-2\n"
    assert preflight.swap(sysctl(tmp_path, "ok", ram_and_crypt), sys_block) is None
    plain = header + "/dev/dm-1\tpartition\t8G\t0\t-2\n/swapfile\tfile\t2G\t0\t-3\n"
    problem = preflight.swap(sysctl(tmp_path, "plain", plain), sys_block)
    assert problem.check == "swap" and "/dev/dm-1, /swapfile" in problem.detail
    assert problem.fix.startswith("swapoff /dev/dm-1 /swapfile")


def test_the_gpu_memory_routine_must_reach_every_gpu_nvml_lists(nvml_stub, tmp_path):
    env = agent_env(nvml_stub)
    assert preflight.gpu_memory([], 0, env) is None                   # no GPU, nothing to clear
    assert preflight.gpu_memory([], 2, env) is None                   # the stub libcuda's two
    short = preflight.gpu_memory([], 3, env)
    assert "cannot reach the 3 GPU(s)" in short.detail and "sees 2" in short.detail
    no_driver = preflight.gpu_memory([], 2, {**env, "LD_LIBRARY_PATH": str(tmp_path)})
    assert "libcuda.so.1" in no_driver.detail and "[gpu_memory] command" in no_driver.fix
    assert preflight.gpu_memory([str(tmp_path / "clear-vram"), "{uuid}"], 2, env).check == "gpu_memory"
    assert preflight.gpu_memory(["true"], 2, env) is None


def test_a_waived_check_warns_and_the_others_still_refuse(caplog):
    problems = [preflight.storage_driver({"Driver": "vfs"}), preflight.pid_max(0, 1)]
    with caplog.at_level(logging.WARNING, logger="nodeagent.preflight"):
        refused = preflight.refusals(problems, ("pid_max",))
    assert refused == problems[:1]
    assert "pid_max waived" in caplog.text and "unlimited" in caplog.text
    assert parse_config({"preflight_waive": ["io_uring"]}).preflight_waive == ("io_uring",)
    with pytest.raises(ConfigError, match="no such check io_urin"):
        parse_config({"preflight_waive": ["io_urin"]})


# -- against the tests' real dockerd --------------------------------------------------------
def _daemon_command_line(dockerd) -> list[str]:
    pid = (Path(dockerd.socket.removeprefix("unix://")).parent / "docker.pid").read_text().strip()
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_the_checks_read_the_real_daemons_info(dockerd):
    info = dockerd.client().info()
    installed = subprocess.run([require_tool("dockerd"), "--version"], capture_output=True,
                               text=True, check=True).stdout
    version = re.search(r"version (\S+?),", installed).group(1)
    assert info["ServerVersion"] == version
    # what the daemon was started with (tests/nodeagent/conftest.py) is what the check sees
    started = next(arg.split("=", 1)[1] for arg in _daemon_command_line(dockerd)
                   if arg.startswith("--storage-driver="))
    problem = preflight.storage_driver(info)
    assert (problem is None) == (started == "overlay2")
    assert problem is None or started in problem.detail
    assert preflight.seccomp_profile(info) in ("default", "builtin")  # no profile given to it
    cdi_problem = preflight.cdi(info, "cdi")                          # not enabled there
    assert cdi_problem is not None and info["ServerVersion"] in cdi_problem.detail
    # the cgroup driver the reload check reads is the daemon's own key
    assert info["CgroupDriver"] in ("systemd", "cgroupfs", "none")
    reload = preflight.gpu_reload(info, "nvidia", {"nvidia0": os.makedev(195, 0)}, Path("/nonexistent"))
    assert (reload is None) == (info["CgroupDriver"] != "systemd")


@pytest.fixture(scope="module")
def io_uring_probe_image(dockerd, tmp_path_factory) -> str:
    """An image holding only the static io_uring probe (io_uring_probe/)."""
    gcc = require_tool("gcc")
    binary = tmp_path_factory.mktemp("probe") / "io_uring_probe"
    subprocess.run([gcc, "-static", "-O2", "-o", str(binary), str(PROBE_SOURCE)], check=True)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(binary, arcname="io_uring_probe")
    dockerd.client().api.import_image_from_data(archive.getvalue(), repository="gna-io-uring-probe",
                                                 tag="1")
    return "gna-io-uring-probe:1"


def _io_uring_reachable(dockerd, image, security_opt) -> bool:
    """Whether io_uring_setup made a ring in a container confined as instances are."""
    container = dockerd.client().containers.create(
        image, ["/io_uring_probe"], network_mode="none", cap_drop=["ALL"],
        security_opt=["no-new-privileges:true", *security_opt])
    try:
        container.start()
        code = container.wait(timeout=120)["StatusCode"]
    finally:
        container.remove(force=True)
    assert code in (0, 1), f"the probe failed: exit {code}"
    return code == 0


def test_what_the_io_uring_check_says_of_the_real_daemon_holds_in_an_instance(dockerd, io_uring_probe_image):
    """The check never passes a node whose instances reach io_uring; the shipped fallback
    profile, loaded by the real dockerd and runc, stops io_uring_setup in an instance."""
    info = dockerd.client().info()
    reachable = _io_uring_reachable(dockerd, io_uring_probe_image, [])
    verdict = preflight.io_uring(info)                 # this host's real sysctl
    if reachable:
        assert verdict is not None, "io_uring reaches the kernel from an instance, the check passed it"
    if Path(preflight.IO_URING_SYSCTL).exists() and preflight._read_int(preflight.IO_URING_SYSCTL) != 2:
        # io_uring is on in this kernel: only seccomp can stop it, and the shipped profile does
        assert reachable == (preflight.io_uring(info, Path("/nonexistent")) is not None)
        profile = "seccomp=" + json.dumps(json.loads(SHIPPED_PROFILE.read_text()), separators=(",", ":"))
        assert not _io_uring_reachable(dockerd, io_uring_probe_image, [profile])


def test_a_node_failing_a_check_is_refused_at_enrol_and_run_before_the_storefront_is_asked(
        dockerd, nvml_stub, storefront, tmp_path):
    state = tmp_path / "state"
    config = write_config(tmp_path / "config.toml", state_dir=state, dockerd=dockerd,
                          image_ref="unused", public_host="192.0.2.1")
    # pids_limit as large as the whole pid space: no kernel.pid_max holds two of them
    host_pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    waived = config.read_text().replace('gpu_mode = "devices"', f'gpu_mode = "devices"\npids_limit = {host_pid_max}')
    config.write_text(waived.replace('preflight_waive = ["io_uring", "pid_max"]', 'preflight_waive = ["io_uring"]'))
    env = agent_env(nvml_stub)
    code = storefront.enrolment_code("n1")
    refused = agent_cli(config, "enrol", "--url", storefront.url, "--code", code, env=env)
    assert refused.returncode == 3, refused.stderr
    assert "refusing to enrol: pid_max: kernel.pid_max is" in refused.stderr
    assert "sysctl -w kernel.pid_max=4194304" in refused.stderr and "install-node.sh" in refused.stderr
    assert code in storefront.codes and not (state / "node-key.pem").exists()   # never asked
    run = agent_cli(config, "run", env=env)
    assert run.returncode == 3 and "refusing to run: pid_max" in run.stderr

    config.write_text(waived)                          # the same node, pid_max waived too
    assert agent_cli(config, "enrol", "--url", storefront.url, "--code", code, env=env).returncode == 0
