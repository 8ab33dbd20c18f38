"""The agent's configuration file (TOML, /etc/gpu-node-agent/config.toml by default).

    storefront_url = "https://shop.example"     # optional: the URL given to `enrol` is kept
    state_dir = "/var/lib/gpu-node-agent"
    ca_bundle = "/etc/gpu-node-agent/ca.pem"    # optional: trust this CA for the storefront
    public_host = "203.0.113.7"                 # the address customers ssh to
    disk_backend = "luks"                       # or "directory" (development: NOT encrypted)
    max_temperature_c = 90                      # a hotter GPU is reported unhealthy
    filter_guard_seconds = 1.0                  # how often the packet filter is checked
    watch = true                                # wait for a change: the report that waits, the watch (PROTOCOL.md)
    telemetry_seconds = 60                      # one GPU telemetry sample per card this often (0: off)

    [disks]                                     # options for the disk backend
    root = "/var/lib/gpu-node-agent/disks"

    [docker]
    socket = "unix:///var/run/docker.sock"   # the node's own dockerd (with userns-remap)
    blocked_networks = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]  # + link-local
    gpu_mode = "nvidia"        # nvidia (toolkit device requests) | cdi | devices (tests)
    port_range = [22000, 22999]
    published_port_range = [23000, 23999]   # customers' ports (default: the 1000 after ssh's)
    max_published_ports = 8    # per lease
    pull_images = true         # pull a configured image missing on the node
    pids_limit = 32768
    pull_retry_seconds = 300   # a failed pull waits this long, doubling, up to the max
    pull_retry_max_seconds = 3600
    ssh_bundle_dir = "/var/lib/gpu-node-ssh"   # the node's sshd for images without one

    [docker.gpu_devices]       # gpu_mode = "devices" only: GPU UUID -> host device node
    "GPU-00000000-0000-0000-0000-000000000000" = "/dev/null"

    [images]                   # storefront image slug -> local image reference
    "ubuntu-22.04-cuda-12.4" = "registry.local/ubuntu-cuda:22.04-12.4"
    min_cuda = "12.4"          # (top level) the CUDA the images need: an older driver drains

    [burn_in]                  # the diagnostic before each sale (nodeagent/burnin.py)
    dcgmi = "dcgmi"
    fallback_command = []      # e.g. ["python3", "/usr/lib/gpu-node-agent/burn_in_fallback.py", "--uuid", "{uuid}"]
    timeout_seconds = 3600
    min_h2d_fraction = 0.6     # host-to-device bandwidth / the link's peak (docs/adr/0013)
    max_remapped_rows = 8      # a card with more fails every burn-in
    max_retired_pages = 10
    bandwidth_command = []     # [] = python -m nodeagent.gpu_bandwidth measure {uuid}

    [gpu_memory]               # a released GPU's memory zeroed (nodeagent/gpu_memory.py)
    command = []               # [] = the built-in CUDA routine; else e.g. ["/usr/local/bin/clear-vram", "{uuid}"]
    timeout_seconds = 300

    preflight_waive = []       # (top level) start checks not enforced: development only
                               # (nodeagent/preflight.py CHECKS, e.g. "io_uring", "pid_max")
"""
import logging
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .burnin import BurnInConfig
from .gpu_memory import GpuMemoryConfig
from .netfilter import DEFAULT_BLOCKED, validate_networks
from .preflight import CHECKS

DEFAULT_CONFIG_PATH = "/etc/gpu-node-agent/config.toml"
DEFAULT_STATE_DIR = "/var/lib/gpu-node-agent"
GPU_MODES = ("nvidia", "cdi", "devices")
# [docker] keys an older configuration may still hold: accepted, ignored, warned about.
OBSOLETE_DOCKER_KEYS = {
    "rootfs_size": "an instance's writable layer lives on its lease's disk and shares its size",
    "log_max_size": "instances' logs are not kept (they could hold tenant bytes)",
}
log = logging.getLogger(__name__)


class ConfigError(Exception):
    pass


@dataclass
class DockerConfig:
    socket: str = "unix:///var/run/docker.sock"
    gpu_mode: str = "nvidia"
    gpu_devices: dict[str, str] = field(default_factory=dict)
    port_range: tuple[int, int] = (22000, 22999)
    stop_timeout: int = 10
    pull_images: bool = True         # pull a configured image that is not on the node yet
    pids_limit: int = 32768          # a tenant's fork bomb stays in its container
    # Isolation (nodeagent/netfilter.py, README "Isolation"): each lease on its own bridge.
    require_userns: bool = True      # refuse a dockerd without userns-remap
    blocked_networks: tuple[str, ...] = DEFAULT_BLOCKED   # never reachable from instances
    masquerade: bool = True          # NAT the instances' traffic leaving the node
    # Customer images (docs/adr/0014): a failed pull is tried again after this, doubling
    # with each failure in a row up to the maximum (new credentials: at once).
    pull_retry_seconds: float = 300.0
    pull_retry_max_seconds: float = 3600.0
    pulled_image_keep_seconds: float = 86400.0   # a customer image asked for lately stays
    # The node's OpenSSH, copied with its loader and libraries, mounted read-only into
    # every instance: SSH into images without sshd (nodeagent/runtime/ssh_bundle.py).
    # Outside the state directory (0700): container root, a remapped uid, must read it.
    ssh_bundle_dir: str = "/var/lib/gpu-node-ssh"
    # Customers' published ports (a desired item's `ports`, runtime/ports.py): host ports
    # from a range of their own, apart from the sshd range (each host port feeds one lease's
    # egress counter, so the two ranges must not overlap), at most this many per lease.
    published_port_range: tuple[int, int] = (23000, 23999)
    max_published_ports: int = 8


@dataclass
class AgentConfig:
    path: Path | None = None
    storefront_url: str = ""
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    ca_bundle: str = ""
    public_host: str = field(default_factory=socket.getfqdn)
    disk_backend: str = "luks"
    disks: dict = field(default_factory=dict)
    docker: DockerConfig = field(default_factory=DockerConfig)
    images: dict[str, str] = field(default_factory=dict)
    max_temperature_c: int = 90
    min_cuda: str = ""
    burn_in: BurnInConfig = field(default_factory=BurnInConfig)
    gpu_memory: GpuMemoryConfig = field(default_factory=GpuMemoryConfig)
    # Start checks (nodeagent/preflight.py) only warned about, not enforced: a development
    # machine or test host that cannot change a kernel setting. Never on a node that sells.
    preflight_waive: tuple[str, ...] = ()
    request_timeout: float = 20.0
    max_backoff_seconds: float = 300.0
    # The packet filter's own check (netfilter.FilterGuard), independent of the rounds: the
    # most a flushed table stays open, whatever the storefront's back-off.
    filter_guard_seconds: float = 1.0
    # Ask the storefront to answer as soon as the desired state changes instead of sleeping
    # the whole poll interval: the round's report waits (POST /agent/v1/report/watch), and
    # what is left of the interval after an early answer, the watch (GET /agent/v1/desired/watch).
    watch: bool = True
    volume_client: str = "auto"      # network volumes: "kernel" CephFS client, "fuse" (ceph-fuse), "auto"
    # GPU telemetry (nodeagent/telemetry.py, PROTOCOL.md "Telemetry"): one sample per card this
    # often (0: off), at most `telemetry_buffer_samples` kept unsent (oldest dropped first: a
    # storefront outage costs bounded memory and disk), at most `telemetry_samples_per_report`
    # sent per report (a backlog drains over several polls, each report stays a few kB), sent
    # once the oldest unsent one is `telemetry_send_minutes` old (fewer writes at the storefront).
    telemetry_seconds: int = 60
    telemetry_buffer_samples: int = 8 * 3 * 1440
    telemetry_samples_per_report: int = 120
    telemetry_send_minutes: int = 5      # send once the oldest unsent sample is this old

    @property
    def tls_verify(self) -> bool | str:
        return self.ca_bundle or True


def load_config(path: str | Path) -> AgentConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    return parse_config(raw, path)


def parse_config(raw: dict, path: Path | None = None) -> AgentConfig:
    raw = dict(raw)
    docker = _docker_config(raw.pop("docker", {}))
    burn_in = _burn_in_config(raw.pop("burn_in", {}))
    gpu_memory = _gpu_memory_config(raw.pop("gpu_memory", {}))
    if "preflight_waive" in raw:
        raw["preflight_waive"] = _preflight_waive(raw["preflight_waive"])
    known = AgentConfig.__dataclass_fields__.keys() - {"path", "docker", "burn_in", "gpu_memory"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
    config = AgentConfig(path=path, docker=docker, burn_in=burn_in, gpu_memory=gpu_memory, **raw)
    config.state_dir = Path(config.state_dir)
    config.storefront_url = config.storefront_url.rstrip("/")
    guard = config.filter_guard_seconds
    if isinstance(guard, bool) or not isinstance(guard, (int, float)) or not 0 < guard <= 60:
        raise ConfigError("filter_guard_seconds must be a number of seconds in (0, 60]")
    if not isinstance(config.watch, bool):
        raise ConfigError("watch must be true or false")
    _check_telemetry(config)
    return config


def _docker_config(raw: dict) -> DockerConfig:
    raw = dict(raw)
    for key, why in OBSOLETE_DOCKER_KEYS.items():
        if key in raw:
            raw.pop(key)
            log.warning("[docker] %s is no longer used and is ignored: %s", key, why)
    for key in ("port_range", "published_port_range"):
        if key in raw:
            low, high = raw[key]
            if not 0 < low <= high < 65536:
                raise ConfigError(f"docker.{key} {raw[key]} is not a port range")
            raw[key] = (low, high)
    ssh = raw.get("port_range", DockerConfig.port_range)
    if "published_port_range" not in raw:
        # An older configuration names the ssh range only: the published ports take the
        # 1,000 ports after it (before it at the top), so it never overlaps on upgrade.
        raw["published_port_range"] = ((ssh[1] + 1, ssh[1] + 1000) if ssh[1] + 1000 < 65536
                                       else (ssh[0] - 1000, ssh[0] - 1))
    published = raw["published_port_range"]
    if not 0 < published[0] <= published[1] < 65536:
        raise ConfigError(f"docker.port_range {list(ssh)} leaves no room for the published "
                          "ports' default range: set docker.published_port_range")
    if ssh[0] <= published[1] and published[0] <= ssh[1]:
        raise ConfigError(f"docker.published_port_range {list(published)} overlaps "
                          f"docker.port_range {list(ssh)} (the sshd ports)")
    count = raw.get("max_published_ports", DockerConfig.max_published_ports)
    if type(count) is not int or not 0 <= count <= 64:
        raise ConfigError("docker.max_published_ports must be a whole number 0-64")
    if "network" in raw or "subnet" in raw:
        raise ConfigError("[docker] network/subnet are gone: every lease gets its own bridge "
                          "network (set dockerd's default-address-pools for the addresses)")
    if "blocked_networks" in raw:
        try:
            raw["blocked_networks"] = tuple(validate_networks(raw["blocked_networks"]))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"docker.blocked_networks: {exc}") from None
    for key in ("pull_retry_seconds", "pull_retry_max_seconds", "pulled_image_keep_seconds"):
        value = raw.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"docker.{key} must be a positive number of seconds")
    if raw.get("gpu_mode", "nvidia") not in GPU_MODES:
        raise ConfigError(f"docker.gpu_mode must be one of {', '.join(GPU_MODES)}")
    unknown = set(raw) - DockerConfig.__dataclass_fields__.keys()
    if unknown:
        raise ConfigError(f"unknown [docker] keys: {', '.join(sorted(unknown))}")
    return DockerConfig(**raw)



def _burn_in_config(raw: dict) -> BurnInConfig:
    unknown = set(raw) - BurnInConfig.__dataclass_fields__.keys()
    if unknown:
        raise ConfigError(f"unknown [burn_in] keys: {', '.join(sorted(unknown))}")
    command = raw.get("fallback_command", [])
    if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        raise ConfigError("burn_in.fallback_command must be a list of strings")
    return BurnInConfig(**raw)


def _gpu_memory_config(raw: dict) -> GpuMemoryConfig:
    unknown = set(raw) - GpuMemoryConfig.__dataclass_fields__.keys()
    if unknown:
        raise ConfigError(f"unknown [gpu_memory] keys: {', '.join(sorted(unknown))}")
    command = raw.get("command", [])
    if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        raise ConfigError("gpu_memory.command must be a list of strings")
    timeout = raw.get("timeout_seconds", GpuMemoryConfig.timeout_seconds)
    if type(timeout) is not int or timeout <= 0:
        raise ConfigError("gpu_memory.timeout_seconds must be a positive number of seconds")
    return GpuMemoryConfig(command=list(command), timeout_seconds=timeout)


def _preflight_waive(raw) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise ConfigError("preflight_waive must be a list of check names")
    unknown = set(raw) - set(CHECKS)
    if unknown:
        raise ConfigError(f"preflight_waive: no such check {', '.join(sorted(unknown))} "
                          f"(checks: {', '.join(CHECKS)})")
    return tuple(raw)


def _check_telemetry(config: AgentConfig) -> None:
    every = config.telemetry_seconds
    if type(every) is not int or not (every == 0 or 60 <= every <= 3600):
        raise ConfigError("telemetry_seconds must be 0 (off) or whole seconds in [60, 3600]")
    for name, low, high in (("telemetry_buffer_samples", 1, 10**6), ("telemetry_samples_per_report", 1, 2000),
                            ("telemetry_send_minutes", 1, 60)):
        value = getattr(config, name)
        if type(value) is not int or not low <= value <= high:
            raise ConfigError(f"{name} must be a whole number in [{low}, {high}]")
