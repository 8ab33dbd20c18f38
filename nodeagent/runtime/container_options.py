"""What a lease's container is launched with (nodeagent/runtime/docker.py creates it): its
labels, limits, capabilities, mounts and GPUs, the hash of the spec that decides when a new
container is needed, and the customer's keys and variables written into it before it starts."""
import hashlib
import io
import json
import logging
import shlex
import tarfile
import time

from docker.types import DeviceRequest, LogConfig

from ..interfaces import InstanceSpec, OperationFailed
from .instance_root import INSTANCE_ROOT
from .ssh_bundle import ENV_FILE

log = logging.getLogger(__name__)

LABEL_LEASE = "gpu-node-agent.lease"
LABEL_SPEC = "gpu-node-agent.spec"
LABEL_PORT = "gpu-node-agent.ssh-port"
WORKSPACE = "/workspace"
# Only the agent starts a container, after it mounted the lease's disk: with a
# restart policy dockerd would start it at boot onto the bare mount point.
NO_RESTART = {"Name": "no"}
VOLUMES = "/volumes"
GiB = 1024 ** 3
# Every capability is dropped but these (Docker's default set minus NET_RAW, MKNOD,
# SETFCAP and SETPCAP); each is what root in an instance needs for sshd and apt:
CAPABILITIES = (
    "CHOWN",             # apt/dpkg and tar set file owners
    "DAC_OVERRIDE",      # root reads/writes files whatever their mode (customer's own)
    "FOWNER",            # chmod/utime on files owned by other uids (dpkg)
    "FSETID",            # keep setgid bits when dpkg writes files
    "KILL",              # signal processes of other uids inside the instance
    "SETGID", "SETUID",  # sshd's privilege separation, apt's _apt user, su to users
    "SYS_CHROOT",        # sshd's privilege-separation chroot (/run/sshd)
    "NET_BIND_SERVICE",  # sshd on port 22, customers' services below 1024
    "AUDIT_WRITE",       # sshd/PAM write login records to the audit log
)
SECURITY_OPT = ("no-new-privileges:true",)    # seccomp: Docker's default profile (not set)
# 1: own network per lease, device paths kept; 2: writable layer, /etc files on the
# lease's disk, no logs (a container made by an older agent is recreated, its disk kept)
ISOLATION_VERSION = 2
NO_LOGS = LogConfig(type="none")  # PID 1's output (sshd, or a tenant writing to it) is not kept
# The instance's view of its disk hides the agent's directory there behind this mount.
MASK = {f"{WORKSPACE}/{INSTANCE_ROOT}": "ro,size=4k,mode=0555"}


class ContainerOptions:
    """DockerRuntime's options of a container: its GPUs, and the files written into it."""

    def _gpu_options(self, uuids: tuple[str, ...]) -> dict:
        uuids = list(uuids)
        if not uuids:
            return {}
        mode = self.config.gpu_mode
        if mode == "nvidia":
            return {"device_requests": [DeviceRequest(driver="nvidia", device_ids=uuids,
                                                      capabilities=[["gpu"]])]}
        if mode == "cdi":
            return {"device_requests": [DeviceRequest(
                driver="cdi", device_ids=[f"nvidia.com/gpu={u}" for u in uuids])]}
        missing = [u for u in uuids if u not in self.config.gpu_devices]
        if missing:
            raise OperationFailed("gpu_missing",
                                  f"no device node configured for {', '.join(missing)}")
        # The node's own path inside too (as the Container Toolkit does): under
        # userns-remap runc bind-mounts the node from the path it has in the container.
        return {"devices": [f"{self.config.gpu_devices[u]}:{self.config.gpu_devices[u]}:rwm"
                            for u in uuids]}

    def _install_keys(self, container, keys: tuple[str, ...],
                      env: tuple[tuple[str, str], ...] = ()) -> None:
        """authorized_keys is written into the container (never baked into an image), and
        rewritten on every convergence so a key change reaches a running instance.
        Beside it ~/.ssh/environment: the lease's variables in every SSH session too (sshd
        runs with PermitUserEnvironment), not only in the start command's environment."""
        files = {".ssh/authorized_keys": "".join(k.strip() + "\n" for k in keys).encode(),
                 ".ssh/environment": _ssh_environment(env)}
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            ssh_dir = tarfile.TarInfo(".ssh")
            ssh_dir.type, ssh_dir.mode, ssh_dir.mtime = tarfile.DIRTYPE, 0o700, time.time()
            tar.addfile(ssh_dir)
            for name, content in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(content), 0o600, time.time()
                tar.addfile(info, io.BytesIO(content))
        if not self._call(container.put_archive, "/root", archive.getvalue()):
            raise OperationFailed("runtime_error", "could not install authorized_keys")

    def _install_env(self, container, env: tuple[tuple[str, str], ...]) -> None:
        """The lease's variables, for the launcher to export (ssh_bundle.ENV_FILE): written
        into the container's writable layer, which is on the lease's encrypted disk, and
        not given to dockerd as the container's Env, which it would keep in plaintext in
        its own data root on the node's disk (and show in `docker inspect`)."""
        content = "".join(f"{name}={shlex.quote(value)}\n" for name, value in env).encode()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(ENV_FILE.lstrip("/"))
            info.size, info.mode, info.mtime = len(content), 0o600, time.time()
            tar.addfile(info, io.BytesIO(content))
        if not self._call(container.put_archive, "/", archive.getvalue()):
            raise OperationFailed("runtime_error", "could not install the environment")


def _ssh_environment(env: tuple[tuple[str, str], ...]) -> bytes:
    """sshd's `NAME=value` lines; a value with a line break cannot be one (it stays in the
    instance's own environment): named in the agent's log, its value never."""
    lines = []
    for name, value in env:
        if "\n" in value or "\r" in value:
            log.warning("variable %s has a line break: not in SSH sessions' environment", name)
            continue
        lines.append(f"{name}={value}\n")
    return "".join(lines).encode()


def container_name(lease_id: int) -> str:
    return f"lease-{lease_id}"


def _spec_hash(spec: InstanceSpec) -> str:
    """What requires a new container when it changes (keys do not: they are rewritten).
    The isolation settings are part of it, so an upgraded agent recreates containers made
    with weaker ones (the disk and the port are kept)."""
    fields = {"image": spec.image, "gpus": list(spec.gpu_uuids), "cpus": spec.cpus,
              "memory_gb": spec.memory_gb, "shm_gb": spec.shm_gb, "disk": spec.disk_path,
              "isolation": [ISOLATION_VERSION, list(CAPABILITIES), list(SECURITY_OPT)]}
    if spec.volumes_path:
        fields["volumes"] = spec.volumes_path
    # Only when set, so that an instance without them keeps its container on upgrade.
    # The environment enters as a digest: it holds secrets, and the hash is a label.
    if spec.env:
        fields["env"] = hashlib.sha256(json.dumps(sorted(spec.env)).encode()).hexdigest()
    if spec.start_command:
        fields["start_command"] = spec.start_command

    if spec.ports:     # which ports are published; their allowed sources are the filter's
        fields["ports"] = sorted(p.port for p in spec.ports)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
