"""The seams of the agent: a runtime runs instances, a disk backend owns each lease's
encrypted disk, a GPU probe lists cards and their health. The agent loop only talks to
these, so a VM runtime (QEMU/KVM + VFIO) or another disk layout can be added beside the
existing ones."""
from dataclasses import dataclass, field
from typing import Protocol


class OperationFailed(Exception):
    """A named failure (`code`, e.g. 'disk_error') with detail, reported to the storefront."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


@dataclass(frozen=True)
class PublishedPort:
    """A customer's TCP port in the instance, published on a host port of its own and
    reachable only from `allow` (normalised CIDRs; empty: from nowhere)."""
    port: int
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class InstanceSpec:
    lease_id: int
    image: str                       # local image reference (mapped from the image slug)
    gpu_uuids: tuple[str, ...]
    ssh_authorized_keys: tuple[str, ...]
    cpus: int
    memory_gb: int
    shm_gb: int
    disk_path: str                   # host path of the lease's mounted disk
    volumes_path: str = ""           # host dir of its network volumes, bound at /volumes
    # A customer's own image (the item's `image_ref`): pulled (again) with the lease's own
    # credentials before first use, so a private image another lease pulled is never
    # reused without them; an operator template's image is used as it is on the node.
    customer_image: bool = False
    # The registry credentials for a private image: in memory only (never in a repr, a
    # log line, the journal or the container's labels).
    registry_auth: dict | None = field(default=None, repr=False, compare=False)
    image_max_bytes: int = 0         # the image's uncompressed size limit (0: none)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)   # values never logged
    start_command: str = ""          # run by /bin/sh -c beside sshd, cwd /workspace
    ports: tuple[PublishedPort, ...] = ()   # the customer's published ports (runtime/ports.py)


@dataclass(frozen=True)
class InstanceStatus:
    lease_id: int
    state: str                       # running | stopped | absent
    ssh_port: int | None = None
    egress_bytes: int = 0
    ports: tuple[tuple[int, int], ...] = ()   # (container port, host port), published


class Runtime(Protocol):
    def ensure_running(self, spec: InstanceSpec) -> InstanceStatus: ...
    def ensure_stopped(self, lease_id: int) -> InstanceStatus: ...
    def ensure_absent(self, lease_id: int) -> InstanceStatus: ...
    def status(self, lease_id: int) -> InstanceStatus: ...
    def lease_ids(self) -> list[int]: ...
    def guard(self) -> None: ...     # keep isolation (packet filter) in place, every round
    # the sources each published port admits now (the filter alone changes; runtime/ports.py)
    def allow_ports(self, lease_id: int, ports: tuple[PublishedPort, ...]) -> None: ...
    def pause(self, lease_id: int) -> bool: ...       # freeze for a snapshot; False if not running
    def unpause(self, lease_id: int) -> None: ...
    def unpause_all(self, *, except_leases: set[int]) -> list[int]: ...


@dataclass
class CommandRecord:
    argv: list[str]
    exit: int
    output: str = ""


@dataclass
class DiskEvidence:
    """The details of a key destruction or a wipe, signed by the agent as evidence."""
    details: dict = field(default_factory=dict)
    commands: list[CommandRecord] = field(default_factory=list)


class Disks(Protocol):
    def ensure_ready(self, lease_id: int, size_gb: int) -> str: ...      # returns mount path
    def is_ready(self, lease_id: int) -> bool: ...                       # mounted where dockerd sees it
    def mount_path(self, lease_id: int) -> str: ...                      # its mounted file system
    def detach(self, lease_id: int) -> None: ...                          # unmount + close, key kept
    def destroy_key(self, lease_id: int) -> DiskEvidence: ...             # idempotent, proven
    def wipe(self, lease_id: int) -> DiskEvidence: ...                    # after destroy_key


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_mb: int
    driver: str
    cuda: str
    temperature_c: int | None
    ecc_uncorrected: int
    xid_errors: tuple[int, ...]
    healthy: bool
    problem: str = ""
    readings: dict = field(default_factory=dict)     # nodeagent/gpu.py: beyond ECC, topology
    conditions: tuple = ()                            # nodeagent/health.Condition, named


class GpuProbe(Protocol):
    library: str                     # "nvml" or "none"
    def inventory(self) -> list[GpuInfo]: ...
