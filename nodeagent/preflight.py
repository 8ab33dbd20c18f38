"""What the node must be before the agent enrols it or runs instances on it, checked at
`enrol` and `run` (nodeagent/cli.py). A node that fails a check is refused with the fix
(exit status 3, the unit does not restart it), never left to fail a customer's order.

Each check is a small function that returns a `Problem` (what is wrong, how to fix it) or
None, reading only what it is given: dockerd's `info` as a dict and the /proc/sys paths,
so tests feed it fake ones. `install-node.sh` prepares all of it (the sysctl file
`nodeagent/sysctl.conf`, dockerd's daemon.json); docs/adr/0004-node-start-checks.md says why
each check exists and what the io_uring fallback is.

A check can be waived by name in the config (`preflight_waive = ["io_uring"]`): a
development machine or a test host that cannot change a kernel setting. A waived problem
is logged as a warning at every start."""
import json
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHECKS = ("storage_driver", "cdi", "gpu_reload", "io_uring", "pid_max", "swap", "gpu_memory")
IO_URING_SYSCTL = Path("/proc/sys/kernel/io_uring_disabled")
PID_MAX_SYSCTL = Path("/proc/sys/kernel/pid_max")
PROC_SWAPS = Path("/proc/swaps")
SYS_BLOCK = Path("/sys/block")
IO_URING_OFF = 2                 # io_uring_setup fails for every process, root included
IO_URING_SYSCALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register")
# Docker Engine 25 dropped the io_uring syscalls from its builtin seccomp profile (moby #46762).
SECCOMP_DENIES_IO_URING_FROM = 25
# Docker Engine 25 has CDI (opt-in: "features": {"cdi": true}); 28.2 turns it on by default.
CDI_FROM = 25
# Tasks (processes and threads) the node itself needs beside its instances: systemd,
# dockerd, containerd shims, the agent; a fork bomb in an instance stops at pids_limit.
NODE_PID_RESERVE = 8192
# What install-node.sh sets (nodeagent/sysctl.conf): the 64-bit kernel's maximum.
PID_MAX_SET_BY_INSTALLER = 4194304
SYSCTL_FILE = "/etc/sysctl.d/60-gpu-node-agent.conf"
DOCKER_INFO_TIMEOUT = 30         # seconds for dockerd to answer `info` at start
GPU_MEMORY_CHECK_TIMEOUT = 60    # seconds for the clearing routine to find the GPUs
SECCOMP_ALLOW = ("SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_TRACE", "SCMP_ACT_NOTIFY")


@dataclass(frozen=True)
class Problem:
    check: str       # one of CHECKS: the name a config can waive
    detail: str      # what is wrong on this node
    fix: str         # what the operator does about it

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}. Fix: {self.fix}"


def storage_driver(info: dict) -> Problem | None:
    """The instances' writable layers live on their lease's encrypted disk: the runtime
    places overlay2's upper and work directories there, so no other driver will do."""
    driver = info.get("Driver") or "?"
    if driver == "overlay2":
        return None
    return Problem("storage_driver", f"dockerd uses the {driver} storage driver, the agent "
                   "needs overlay2 (each instance's writable layer on its lease's disk)",
                   'set "storage-driver": "overlay2" in /etc/docker/daemon.json (as '
                   "nodeagent/docker-daemon.json; install-node.sh installs it) and restart docker")


def cdi(info: dict, gpu_mode: str) -> Problem | None:
    """`gpu_mode = "cdi"` needs a dockerd with CDI on and an NVIDIA spec in its spec
    directories (`CDISpecDirs` in `info`: absent before Docker 25, empty while CDI is off)."""
    if gpu_mode != "cdi":
        return None
    version = info.get("ServerVersion") or "?"
    other_mode = 'or set gpu_mode = "nvidia" in [docker] (NVIDIA Container Toolkit device requests)'
    dirs = info.get("CDISpecDirs")
    if dirs is None and _major(version) < CDI_FROM:
        return Problem("cdi", f"gpu_mode is cdi but dockerd {version} has no CDI (Docker Engine "
                       f"{CDI_FROM} or newer has it)", f"install Docker Engine {CDI_FROM} or newer "
                       f"with CDI on, {other_mode}")
    if not dirs:
        return Problem("cdi", f"gpu_mode is cdi but CDI is off in dockerd {version}",
                       'add "features": {"cdi": true} to /etc/docker/daemon.json (Docker 25 to '
                       f"28.1; on by default from 28.2) and restart docker, {other_mode}")
    if not any(_names_nvidia_gpu(Path(d)) for d in dirs):
        return Problem("cdi", f"no CDI spec for nvidia.com/gpu in {', '.join(dirs)}",
                       "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (again after "
                       f"every driver update), {other_mode}")
    return None


DEV, DEV_CHAR = Path("/dev"), Path("/dev/char")
# install-node.sh installs this rule; NVIDIA's documented fix for nodes that keep the toolkit
UDEV_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"


def nvidia_devices(dev: Path = DEV) -> dict[str, int]:
    """The NVIDIA character devices on the node: name -> device number."""
    found = {}
    for path in sorted(Path(dev).glob("nvidia*")):
        try:
            st = path.stat()
        except OSError:
            continue
        if os.path.isdir(path) or not os.major(st.st_rdev) and not os.minor(st.st_rdev):
            continue
        found[path.name] = st.st_rdev
    return found


def gpu_reload(info: dict, gpu_mode: str, devices: dict[str, int] | None = None,
               char_dir: Path = DEV_CHAR) -> Problem | None:
    """Would a `systemctl daemon-reload` cut running instances off their GPUs? With the
    systemd cgroup driver, systemd rewrites each container's device rules from what it knows:
    device nodes the NVIDIA toolkit's hook added behind runc's back are lost ("Failed to
    initialize NVML: Unknown Error") unless systemd can find them as /dev/char/MAJOR:MINOR.
    Safe: CDI or plain device entries (both in the container's spec), the cgroupfs driver,
    or a /dev/char link for every NVIDIA device node."""
    if gpu_mode in ("cdi", "devices") or info.get("CgroupDriver") in ("cgroupfs", "none"):
        return None
    devices = nvidia_devices() if devices is None else devices
    missing = [name for name, rdev in sorted(devices.items())
               if not (Path(char_dir) / f"{os.major(rdev)}:{os.minor(rdev)}").exists()]
    if not missing:
        return None
    return Problem("gpu_reload", f"dockerd uses the {info.get('CgroupDriver') or '?'} cgroup driver with "
                   f'gpu_mode = "{gpu_mode}" and {", ".join(missing)} have no /dev/char link: a systemctl '
                   "daemon-reload (an upgrade runs one) would cut running instances off their GPUs",
                   'gpu_mode = "cdi" (Docker 25 or newer), or the /dev/char links: install-node.sh '
                   f"installs {UDEV_RULE} (nvidia-ctk system create-dev-char-symlinks --create-all), "
                   'or "exec-opts": ["native.cgroupdriver=cgroupfs"] in /etc/docker/daemon.json')


def _names_nvidia_gpu(directory: Path) -> bool:
    try:
        specs = [p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json")]
    except OSError:
        return False
    for spec in specs:
        try:
            if "nvidia.com/gpu" in spec.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def io_uring(info: dict, sysctl: Path = IO_URING_SYSCTL) -> Problem | None:
    """io_uring is a large kernel attack surface that seccomp cannot see into. Off in the
    kernel where it can be (`kernel.io_uring_disabled = 2`, Linux 6.6+); on an older
    kernel dockerd's seccomp profile must deny the io_uring syscalls (docs/adr/0004)."""
    value = _read_int(sysctl)
    fix_sysctl = (f"sysctl -w kernel.io_uring_disabled={IO_URING_OFF} and keep it in "
                  f"{SYSCTL_FILE} (install-node.sh writes it)")
    if value == IO_URING_OFF:
        return None
    if value is not None:
        return Problem("io_uring", f"kernel.io_uring_disabled is {value}: instances can "
                       "reach io_uring", fix_sysctl)
    version = info.get("ServerVersion") or "?"
    fix_old = (f"boot a kernel with kernel.io_uring_disabled (Linux 6.6 or newer) and run "
               f"install-node.sh again, or install Docker Engine {SECCOMP_DENIES_IO_URING_FROM} "
               "or newer (its default seccomp profile denies io_uring), or run dockerd with "
               '"seccomp-profile": "/etc/docker/gpu-node-seccomp.json" '
               "(nodeagent/seccomp-no-io-uring.json, install-node.sh installs it)")
    profile = seccomp_profile(info)
    if profile is None or profile == "unconfined":
        return Problem("io_uring", f"this kernel has no kernel.io_uring_disabled and dockerd "
                       f"{version} runs containers without seccomp", fix_old)
    if profile in ("default", "builtin"):
        if _major(version) >= SECCOMP_DENIES_IO_URING_FROM:
            return None
        return Problem("io_uring", f"this kernel has no kernel.io_uring_disabled and the "
                       f"default seccomp profile of dockerd {version} allows io_uring", fix_old)
    allowed = profile_allows(Path(profile), IO_URING_SYSCALLS)
    if allowed:
        return Problem("io_uring", f"this kernel has no kernel.io_uring_disabled and dockerd's "
                       f"seccomp profile {profile} does not deny {', '.join(allowed)}", fix_old)
    return None


def seccomp_profile(info: dict) -> str | None:
    """The daemon's seccomp profile as `info` names it ("default" before Docker 25,
    "builtin" after, or the path of `seccomp-profile`); None without seccomp."""
    for option in info.get("SecurityOptions") or ():
        fields = dict(part.partition("=")[::2] for part in str(option).split(","))
        if fields.get("name") == "seccomp":
            return fields.get("profile") or "default"
    return None


def profile_allows(path: Path, syscalls) -> list[str]:
    """The syscalls of `syscalls` a seccomp profile (Docker's JSON format) lets through:
    by a rule that allows them (with or without conditions) or by an allowing default.
    An unreadable profile allows everything as far as this check knows."""
    try:
        profile = json.loads(path.read_text())
        rules = profile.get("syscalls") or []
        default = profile.get("defaultAction", "")
    except (OSError, ValueError, AttributeError):
        return list(syscalls)
    allowed = set(syscalls) if default in SECCOMP_ALLOW else set()
    for rule in rules:
        if not isinstance(rule, dict) or rule.get("action") not in SECCOMP_ALLOW:
            continue
        names = set(rule.get("names") or ()) | ({rule["name"]} if rule.get("name") else set())
        allowed |= names & set(syscalls)
    return sorted(allowed)


def pid_max(pids_limit: int, instances: int, sysctl: Path = PID_MAX_SYSCTL) -> Problem | None:
    """Every instance may hold `pids_limit` tasks at once: the kernel's pid space must hold
    all of them and the node's own, or one tenant's fork bomb starves the others and
    the node (no new process: no sshd session, no agent subprocess)."""
    fix = (f"sysctl -w kernel.pid_max={PID_MAX_SET_BY_INSTALLER} and keep it in {SYSCTL_FILE} "
           "(install-node.sh writes it), or lower docker.pids_limit")
    if pids_limit <= 0:
        return Problem("pid_max", "docker.pids_limit is unlimited: one instance can take every "
                       "pid of the node", "set docker.pids_limit (default 32768)")
    needed = pids_limit * max(instances, 1) + NODE_PID_RESERVE
    value = _read_int(sysctl)
    if value is None or value < needed:
        return Problem("pid_max", f"kernel.pid_max is {value}, below the {needed} that "
                       f"{max(instances, 1)} instance(s) of pids_limit {pids_limit} and the "
                       f"node's own {NODE_PID_RESERVE} need", fix)
    return None


def swap(swaps: Path = PROC_SWAPS, sys_block: Path = SYS_BLOCK) -> Problem | None:
    """An instance's memory must not be paged to a disk in plaintext, where it would outlive
    the lease: swap is off, in RAM (zram) or on a dm-crypt device."""
    try:
        lines = Path(swaps).read_text().splitlines()[1:]
    except OSError:
        return None                       # no /proc/swaps: a kernel without swap support
    plain = []
    for line in lines:
        if not line.split():
            continue
        device = line.split()[0]
        name = os.path.basename(os.path.realpath(device))
        if name.startswith("zram"):
            continue
        uuid = Path(sys_block) / name / "dm" / "uuid"
        try:
            if uuid.read_text().startswith("CRYPT-"):
                continue
        except OSError:
            pass
        plain.append(device)
    if not plain:
        return None
    return Problem("swap", f"swap on {', '.join(plain)} is not encrypted: instances' memory "
                   "would be written there in plaintext and outlive their leases",
                   f"swapoff {' '.join(plain)} and remove it from /etc/fstab, or put swap on "
                   "dm-crypt with a random key per boot (crypttab: swap,cipher=aes-xts-plain64,"
                   "size=512,key=/dev/urandom) or on zram")


def gpu_memory(command: list[str], gpu_count: int, env: dict | None = None) -> Problem | None:
    """The routine that clears a released GPU's memory (nodeagent/gpu_memory.py) must be
    able to run here, or every lease's end would report GPU memory not cleared."""
    if gpu_count == 0:
        return None
    fix = ("install the NVIDIA driver's CUDA library (libcuda.so.1), or set [gpu_memory] "
           "command to a routine for this node's GPUs (nodeagent/README.md)")
    if command:
        if not (os.path.isabs(command[0]) and os.access(command[0], os.X_OK)) and \
                not _which(command[0]):
            return Problem("gpu_memory", f"[gpu_memory] command {command[0]} is not an "
                           "executable", fix)
        return None
    try:
        done = subprocess.run([sys.executable, "-m", "nodeagent.gpu_memory", "count"],
                              capture_output=True, text=True, env=env,
                              timeout=GPU_MEMORY_CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return Problem("gpu_memory", "the GPU memory clearing routine did not find the GPUs in "
                       f"{GPU_MEMORY_CHECK_TIMEOUT}s", fix)
    found = done.stdout.strip()
    if done.returncode != 0 or not found.isdigit() or int(found) < gpu_count:
        why = (done.stderr.strip().splitlines() or [f"it sees {found or 'no'} GPUs"])[-1]
        return Problem("gpu_memory", f"the GPU memory clearing routine cannot reach the "
                       f"{gpu_count} GPU(s) NVML lists: {why}", fix)
    return None


def node_problems(config, info: dict, *, gpu_count: int, io_uring_sysctl: Path = IO_URING_SYSCTL,
                  pid_max_sysctl: Path = PID_MAX_SYSCTL, env: dict | None = None) -> list[Problem]:
    """Every check, in the order an operator fixes them."""
    found = [storage_driver(info), cdi(info, config.docker.gpu_mode),
             gpu_reload(info, config.docker.gpu_mode), io_uring(info, io_uring_sysctl),
             pid_max(config.docker.pids_limit, gpu_count, pid_max_sysctl), swap(),
             gpu_memory(list(config.gpu_memory.command), gpu_count, env)]
    return [p for p in found if p is not None]


def docker_info(socket: str) -> dict:
    """dockerd's `info`; OperationFailed when it does not answer (systemd restarts the
    agent: dockerd may still be starting)."""
    import docker
    from docker.errors import DockerException

    from .interfaces import OperationFailed

    try:
        client = docker.DockerClient(base_url=socket, timeout=DOCKER_INFO_TIMEOUT)
        try:
            return client.info()
        finally:
            client.close()
    except DockerException as exc:
        raise OperationFailed("runtime_error", f"docker at {socket}: {exc}") from exc


def refusals(problems: list[Problem], waived) -> list[Problem]:
    """The problems that refuse the node; the waived ones are logged, not forgotten."""
    for problem in problems:
        if problem.check in waived:
            log.warning("preflight check %s waived by the config (development only): %s",
                        problem.check, problem)
    return [p for p in problems if p.check not in waived]


def _read_int(path: Path) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _major(version: str) -> int:
    match = re.match(r"(\d+)\.", version or "")
    return int(match.group(1)) if match else 0


def _which(name: str) -> bool:
    from shutil import which
    return which(name) is not None
