"""The Docker runtime: one container per lease (named `lease-<id>`) through the Docker
Engine API, with exactly the lease's GPUs, CPU/memory/shm limits, the lease's disk at
/workspace, the customer's keys in root's authorized_keys and sshd on a published port.

GPUs are attached by NVML UUID: NVIDIA Container Toolkit device requests
(`gpu_mode = "nvidia"`), CDI names `nvidia.com/gpu=<uuid>` (`"cdi"`, preferred where the
toolkit generated a CDI spec), or plain device nodes from `[docker.gpu_devices]`
(`"devices"`, for tests and unusual hosts)."""
import hashlib
import io
import json
import logging
import os
import tarfile
import time

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest, LogConfig

from ..config import DockerConfig
from ..interfaces import InstanceSpec, InstanceStatus, OperationFailed
from .egress import EgressMeter
from .ports import PortBook

log = logging.getLogger(__name__)

LABEL_LEASE = "gpu-node-agent.lease"
LABEL_SPEC = "gpu-node-agent.spec"
LABEL_PORT = "gpu-node-agent.ssh-port"
WORKSPACE = "/workspace"
VOLUMES = "/volumes"
GiB = 1024 ** 3


class DockerRuntime:
    def __init__(self, config: DockerConfig, state_dir):
        self.config = config
        try:
            self.client = docker.DockerClient(base_url=config.socket, timeout=120)
            self.client.ping()
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker at {config.socket}: {exc}") from exc
        os.makedirs(state_dir, exist_ok=True)
        self.ports = PortBook(state_dir / "ports.json", config.port_range)
        self.egress = EgressMeter(state_dir / "egress.json")
        self._network_ready = False

    # -- Runtime interface -------------------------------------------------------------
    def ensure_running(self, spec: InstanceSpec) -> InstanceStatus:
        container = self._container(spec.lease_id)
        if container is not None and container.labels.get(LABEL_SPEC) != _spec_hash(spec):
            log.info("lease %s: specification changed, recreating its container",
                     spec.lease_id)
            self._remove(container)
            container = None
        if container is None:
            container = self._create(spec)
        self._install_keys(container, spec.ssh_authorized_keys)
        if container.status != "running":
            self._call(container.start)
            self._wait_running(container)
        return self.status(spec.lease_id)

    def ensure_stopped(self, lease_id: int) -> InstanceStatus:
        container = self._container(lease_id)
        if container is not None and container.status in ("running", "restarting"):
            self.egress.observe(lease_id, self._tx_bytes(container))
            self._call(container.stop, timeout=self.config.stop_timeout)
        return self.status(lease_id)

    def ensure_absent(self, lease_id: int) -> InstanceStatus:
        container = self._container(lease_id)
        if container is not None:
            self._remove(container)
        self.ports.release(lease_id)
        self.egress.forget(lease_id)
        return InstanceStatus(lease_id=lease_id, state="absent")

    def status(self, lease_id: int) -> InstanceStatus:
        container = self._container(lease_id)
        if container is None:
            return InstanceStatus(lease_id=lease_id, state="absent")
        running = container.status in ("running", "restarting")
        egress = self.egress.observe(lease_id, self._tx_bytes(container) if running else None)
        return InstanceStatus(lease_id=lease_id, state="running" if running else "stopped",
                              ssh_port=int(container.labels[LABEL_PORT]),
                              egress_bytes=egress)

    def lease_ids(self) -> list[int]:
        containers = self._call(self.client.containers.list, all=True,
                                filters={"label": LABEL_LEASE})
        return sorted(int(c.labels[LABEL_LEASE]) for c in containers)

    # -- containers ----------------------------------------------------------------------
    def _create(self, spec: InstanceSpec):
        self._require_image(spec.image)
        port = self.ports.port_for(spec.lease_id)
        host_mode = self.config.network == "host"
        if not host_mode:
            self._ensure_network()
        kwargs = dict(
            image=spec.image,
            name=container_name(spec.lease_id),
            hostname=container_name(spec.lease_id),
            command=["/bin/sh", "-c", _sshd_command(port if host_mode else 22)],
            labels={LABEL_LEASE: str(spec.lease_id), LABEL_SPEC: _spec_hash(spec),
                    LABEL_PORT: str(port)},
            nano_cpus=min(spec.cpus, os.cpu_count() or spec.cpus) * 10 ** 9,
            mem_limit=spec.memory_gb * GiB,
            shm_size=spec.shm_gb * GiB,
            volumes={spec.disk_path: {"bind": WORKSPACE, "mode": "rw"}},
            working_dir=WORKSPACE,
            network=self.config.network,
            restart_policy={"Name": "unless-stopped"},
            pids_limit=self.config.pids_limit,
            log_config=LogConfig(type="json-file", config={"max-size": self.config.log_max_size,
                                                           "max-file": "3"}),
            detach=True,
            **self._gpu_options(spec.gpu_uuids),
        )
        if spec.volumes_path:  # network volumes (nodeagent/volumes.py), mounted later appear too
            kwargs["volumes"][spec.volumes_path] = {"bind": VOLUMES, "mode": "rw,rslave"}
        if not host_mode:
            kwargs["ports"] = {"22/tcp": port}
        return self._call(self.client.containers.create, **kwargs)

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
        return {"devices": [f"{self.config.gpu_devices[u]}:/dev/nvidia{i}:rwm"
                            for i, u in enumerate(uuids)]}

    def _install_keys(self, container, keys: tuple[str, ...]) -> None:
        """authorized_keys is written into the container (never baked into an image), and
        rewritten on every convergence so a key change reaches a running instance."""
        content = "".join(k.strip() + "\n" for k in keys).encode()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            ssh_dir = tarfile.TarInfo(".ssh")
            ssh_dir.type, ssh_dir.mode, ssh_dir.mtime = tarfile.DIRTYPE, 0o700, time.time()
            tar.addfile(ssh_dir)
            keys_file = tarfile.TarInfo(".ssh/authorized_keys")
            keys_file.size, keys_file.mode, keys_file.mtime = len(content), 0o600, time.time()
            tar.addfile(keys_file, io.BytesIO(content))
        if not self._call(container.put_archive, "/root", archive.getvalue()):
            raise OperationFailed("runtime_error", "could not install authorized_keys")

    def _wait_running(self, container, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            container.reload()
            if container.status == "running":
                return
            if container.status in ("exited", "dead"):
                break
            time.sleep(0.2)
        logs = container.logs(tail=20).decode(errors="replace")
        raise OperationFailed("runtime_error",
                              f"container {container.name} is {container.status}: {logs}")

    def _remove(self, container) -> None:
        try:
            container.remove(force=True)
        except NotFound:
            pass
        except APIError as exc:
            raise OperationFailed("runtime_error", f"remove {container.name}: {exc}") from exc

    def _container(self, lease_id: int):
        try:
            return self.client.containers.get(container_name(lease_id))
        except NotFound:
            return None
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker: {exc}") from exc

    def _tx_bytes(self, container) -> int | None:
        try:
            stats = container.stats(stream=False, one_shot=True)
        except DockerException:
            return None
        networks = stats.get("networks") or {}
        return sum(n.get("tx_bytes", 0) for n in networks.values()) if networks else None

    def _require_image(self, ref: str) -> None:
        try:
            self.client.images.get(ref)
            return
        except ImageNotFound:
            if not self.config.pull_images:
                raise OperationFailed("image_missing",
                                      f"image {ref!r} is not on this node") from None
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker: {exc}") from exc
        try:
            log.info("pulling image %s", ref)
            self.client.images.pull(ref)
        except DockerException as exc:
            raise OperationFailed("image_missing",
                                  f"image {ref!r} is not on this node and pulling it failed: "
                                  f"{exc}") from exc

    def _ensure_network(self) -> None:
        name = self.config.network
        if self._network_ready or name in ("bridge", "default"):
            return
        if not self._call(self.client.networks.list, names=[name]):
            ipam = None
            if self.config.subnet:
                ipam = docker.types.IPAMConfig(
                    pool_configs=[docker.types.IPAMPool(subnet=self.config.subnet)])
            self._call(self.client.networks.create, name, driver="bridge", ipam=ipam)
        self._network_ready = True

    @staticmethod
    def _call(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker: {exc}") from exc


def container_name(lease_id: int) -> str:
    return f"lease-{lease_id}"


def _spec_hash(spec: InstanceSpec) -> str:
    """What requires a new container when it changes (keys do not: they are rewritten)."""
    fields = {"image": spec.image, "gpus": list(spec.gpu_uuids), "cpus": spec.cpus,
              "memory_gb": spec.memory_gb, "shm_gb": spec.shm_gb, "disk": spec.disk_path}
    if spec.volumes_path:
        fields["volumes"] = spec.volumes_path
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _sshd_command(port: int) -> str:
    # Host keys are made at first start, so no two instances share one.
    return ("ssh-keygen -A >/dev/null && mkdir -p /run/sshd && "
            f"exec /usr/sbin/sshd -D -e -p {port} -o PasswordAuthentication=no "
            "-o PermitRootLogin=prohibit-password")
