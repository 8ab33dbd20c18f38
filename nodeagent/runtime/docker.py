"""The Docker runtime: one container per lease (named `lease-<id>`) through the Docker
Engine API, with exactly the lease's GPUs, CPU/memory/shm limits, the lease's disk at
/workspace, the customer's keys in root's authorized_keys and sshd on a published port.

Isolation: each lease's container alone on its own bridge network
(`lease-<id>`, bridge `gl<id>`) behind the agent's nftables table (nodeagent/netfilter.py),
every capability dropped but `CAPABILITIES`, no-new-privileges, Docker's default seccomp
profile, and a daemon with `userns-remap` (container root is an unprivileged host uid;
refused otherwise unless `require_userns = false`).

Tenant bytes: the container's writable layer and its /etc files live on the lease's
encrypted disk, its logs are not kept (nodeagent/runtime/instance_root.py); the writable
layer is therefore limited by the lease's disk, and dockerd must use overlay2.

GPUs are attached by NVML UUID: NVIDIA Container Toolkit device requests
(`gpu_mode = "nvidia"`), CDI names `nvidia.com/gpu=<uuid>` (`"cdi"`, preferred where the
toolkit generated a CDI spec), or plain device nodes from `[docker.gpu_devices]`
(`"devices"`, for tests and unusual hosts).

What the container is launched with (labels, limits, capabilities, GPUs, the keys and variables
written into it) is nodeagent/runtime/container_options.py; the customer's published ports
(their label, limits and filter rules) nodeagent/runtime/published_ports.py."""
import logging
import os
import subprocess
import time

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from ..config import DockerConfig
from ..gpu_attachment import PROBE, parse_probe
from ..interfaces import InstanceSpec, InstanceStatus, OperationFailed
from ..netfilter import LeaseRule, PacketFilter, bridge_name, socket_peer_pid
from .container_options import (
    CAPABILITIES,
    LABEL_LEASE,
    LABEL_PORT,
    LABEL_SPEC,
    MASK,
    NO_LOGS,
    NO_RESTART,
    SECURITY_OPT,
    VOLUMES,
    WORKSPACE,
    ContainerOptions,
    GiB,
    _spec_hash,
    container_name,
)
from .egress import EgressMeter
from .images import ImagePuller
from .instance_root import etc_binds, forget_other_layers, place_layer
from .ports import AllowBook, PortBook, PublishedPortBook
from .published_ports import PublishedPorts, _published, _published_label
from .ssh_bundle import BUNDLE_MOUNT, LAUNCHER, build_bundle

log = logging.getLogger(__name__)

IMAGE_PULLING = "image_pulling"     # not a failure: reported until the pull is done
NFT_FILE = "nftables.nft"  # the table as last written, for nftables.service at boot
STORAGE_DRIVER = "overlay2"      # the writable layer's directories can move (instance_root.py)


class DockerRuntime(ContainerOptions, PublishedPorts):
    def __init__(self, config: DockerConfig, state_dir, *, images: frozenset[str] = frozenset()):
        self.config = config
        try:
            self.client = docker.DockerClient(base_url=config.socket, timeout=120)
            self.client.ping()
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker at {config.socket}: {exc}") from exc
        self.root_uid = self._remapped_root(config.require_userns)
        os.makedirs(state_dir, exist_ok=True)
        self.ports = PortBook(state_dir / "ports.json", config.port_range)
        self.published = PublishedPortBook(state_dir / "published-ports.json",
                                           config.published_port_range)
        self.allows = AllowBook(state_dir / "port-allow.json")
        self.egress = EgressMeter(state_dir / "egress.json")
        self.puller = ImagePuller(config.socket, state_dir / "images.json", keep=images,
                                  retry_seconds=config.pull_retry_seconds,
                                  retry_max_seconds=config.pull_retry_max_seconds,
                                  keep_seconds=config.pulled_image_keep_seconds)
        try:
            self.ssh_bundle = str(build_bundle(config.ssh_bundle_dir))
        except (OperationFailed, OSError, subprocess.SubprocessError) as exc:
            # images with their own sshd still work; the others' instances say so in
            # their /var/log/instance.log
            log.error("no SSH bundle for images without sshd: %s", exc)
            self.ssh_bundle = ""
        try:
            peer = socket_peer_pid(config.socket)
        except OSError as exc:
            raise OperationFailed("runtime_error", f"docker at {config.socket}: {exc}") from exc
        if peer is None:
            raise OperationFailed("runtime_error", "docker.socket must be the node's own unix "
                                  "socket: the packet filter goes where dockerd's bridges are")
        self.filter = PacketFilter(blocked_networks=config.blocked_networks,
                                   masquerade=config.masquerade, netns_pid=peer,
                                   saved_path=state_dir / NFT_FILE)
        self._sync_filter(force=True)      # before any instance runs (agent start, reboot)

    # -- Runtime interface -------------------------------------------------------------
    def ensure_running(self, spec: InstanceSpec) -> InstanceStatus:
        self._check_ports(spec)
        container = self._container(spec.lease_id)
        if container is not None and container.labels.get(LABEL_SPEC) != self._spec_hash(spec):
            log.info("lease %s: specification changed, recreating its container",
                     spec.lease_id)
            self._remove(container)
            container = None
        if container is None:
            container = self._create(spec)
        elif container.status not in ("running", "restarting", "paused"):
            self._layer_on_lease_disk(container, spec)     # after a reboot: checked again
        self.allows.set(spec.lease_id, spec.ports)
        self._sync_filter()                # the lease's rules exist before it starts
        self._install_keys(container, spec.ssh_authorized_keys, spec.env)
        self._install_env(container, spec.env)
        self._no_restart_policy(container)
        if container.status != "running":
            self._call(container.start)
            self._wait_running(container)
        return self.status(spec.lease_id)

    def ensure_stopped(self, lease_id: int) -> InstanceStatus:
        container = self._container(lease_id)
        if container is not None and container.status in ("running", "restarting"):
            self._call(container.stop, timeout=self.config.stop_timeout)
        return self.status(lease_id)

    def ensure_absent(self, lease_id: int) -> InstanceStatus:
        container = self._container(lease_id)
        if container is not None:
            self._remove(container)
        self._remove_network(lease_id)
        self._sync_filter()
        self.ports.release(lease_id)
        self.published.release(lease_id)
        self.allows.forget(lease_id)
        self.egress.forget(lease_id)
        return InstanceStatus(lease_id=lease_id, state="absent")

    def status(self, lease_id: int) -> InstanceStatus:
        container = self._container(lease_id)
        if container is None:
            return InstanceStatus(lease_id=lease_id, state="absent")
        # paused: frozen for a snapshot (nodeagent/snapshots.py), still the running instance
        running = container.status in ("running", "restarting", "paused")
        self._sync_filter()
        egress = self.egress.observe(lease_id, self.filter.egress_bytes().get(lease_id))
        return InstanceStatus(lease_id=lease_id, state="running" if running else "stopped",
                              ssh_port=int(container.labels[LABEL_PORT]),
                              egress_bytes=egress, ports=_published(container.labels))

    def allow_ports(self, lease_id: int, ports) -> None:
        """The sources each published port of the lease admits (`PublishedPort`s; a port the
        instance publishes but `ports` omits admits nobody). Only the packet filter changes:
        the instance keeps running. Which ports are published is the spec's (a change
        recreates the container, ensure_running)."""
        if self.allows.set(lease_id, tuple(ports)):
            log.info("lease %s: published ports' allowed sources changed", lease_id)
            self._sync_filter()

    # -- snapshots: called from the snapshot worker thread, own client ------------
    def pause(self, lease_id: int) -> bool:
        """Freeze a running instance's processes (cgroup freezer); False if it does not run."""
        container = self._worker_container(lease_id)
        if container is None or container.status != "running":
            return False
        self._call(container.pause)
        return True

    def unpause(self, lease_id: int) -> None:
        container = self._worker_container(lease_id)
        if container is not None and container.status == "paused":
            self._call(container.unpause)

    def unpause_all(self, *, except_leases: set[int]) -> list[int]:
        """An instance left paused by an agent killed mid-snapshot runs again."""
        paused = self._call(self.client.containers.list, all=True,
                            filters={"label": LABEL_LEASE, "status": "paused"})
        resumed = []
        for container in paused:
            lease_id = int(container.labels[LABEL_LEASE])
            if lease_id not in except_leases:
                self._call(container.unpause)
                log.warning("lease %s: was left paused (snapshot interrupted): resumed", lease_id)
                resumed.append(lease_id)
        return resumed

    def gpu_access(self, lease_id: int) -> dict | None:
        """Whether the lease's running instance still opens its GPUs' device nodes
        (nodeagent/gpu_attachment.py): {"uuids", "seen", "unreachable"}; None when it is
        not running."""
        container = self._container(lease_id)
        if container is None or container.status != "running":
            return None
        host = container.attrs.get("HostConfig", {})
        uuids = [i.split("=", 1)[-1] for r in host.get("DeviceRequests") or [] for i in r.get("DeviceIDs") or []]
        paths = [d.get("PathInContainer", "") for d in host.get("Devices") or []]
        by_path = {p: u for u, p in self.config.gpu_devices.items()}
        uuids += [by_path[p] for p in paths if p in by_path]
        result = self._call(container.exec_run, ["sh", "-c", PROBE, "sh", *paths], user="0")
        seen, unreachable = parse_probe(result.output.decode(errors="replace") if result.output else "")
        return {"uuids": uuids, "seen": seen, "unreachable": unreachable}

    def _worker_container(self, lease_id: int):
        client = docker.DockerClient(base_url=self.config.socket, timeout=120)
        try:
            return client.containers.get(container_name(lease_id))
        except NotFound:
            return None
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker: {exc}") from exc

    def _spec_hash(self, spec: InstanceSpec) -> str:
        return _spec_hash(spec)

    def guard(self) -> None:
        """Rewrite the packet filter if it was flushed or changed (each agent round)."""
        self._sync_filter()

    def lease_ids(self) -> list[int]:
        containers = self._call(self.client.containers.list, all=True,
                                filters={"label": LABEL_LEASE})
        return sorted(int(c.labels[LABEL_LEASE]) for c in containers)

    def _published_ports(self, *, but: int) -> frozenset[int]:
        """Ports the other instances on this host publish, read from their labels."""
        containers = self._call(self.client.containers.list, all=True, filters={"label": LABEL_LEASE})
        return frozenset(int(c.labels[LABEL_PORT]) for c in containers
                         if c.labels.get(LABEL_PORT, "").isdigit() and c.labels[LABEL_LEASE] != str(but))

    # -- containers ----------------------------------------------------------------------
    def pull_progress(self, ref: str) -> dict | None:
        """{"done_bytes", "total_bytes"} while `ref` is being pulled (the lease's report)."""
        return self.puller.progress(ref)

    def _create(self, spec: InstanceSpec):
        self._require_image(spec)
        port = self.ports.port_for(spec.lease_id, taken=self._published_ports(but=spec.lease_id))
        published = self._publish(spec)
        network = self._ensure_network(spec.lease_id)
        self._own_workspace(spec.disk_path)
        volumes = {spec.disk_path: {"bind": WORKSPACE, "mode": "rw"},
                   **etc_binds(spec.disk_path, container_name(spec.lease_id), self.root_uid)}
        kwargs = dict(
            image=spec.image,
            name=container_name(spec.lease_id),
            hostname=container_name(spec.lease_id),
            # the launcher (ssh_bundle.py): sshd, and the start command beside it
            command=["/bin/sh", "-c", LAUNCHER, "instance", spec.start_command],
            labels={LABEL_LEASE: str(spec.lease_id), LABEL_SPEC: self._spec_hash(spec),
                    LABEL_PORT: str(port), **_published_label(published)},
            nano_cpus=min(spec.cpus, os.cpu_count() or spec.cpus) * 10 ** 9,
            mem_limit=spec.memory_gb * GiB,
            shm_size=spec.shm_gb * GiB,
            volumes=volumes,
            tmpfs=dict(MASK),
            working_dir=WORKSPACE,
            network=network,
            ports={"22/tcp": port, **{f"{c}/tcp": h for c, h in published.items()}},
            cap_drop=["ALL"],
            cap_add=list(CAPABILITIES),
            security_opt=list(SECURITY_OPT),
            restart_policy=NO_RESTART,
            pids_limit=self.config.pids_limit,
            log_config=NO_LOGS,
            detach=True,
            **self._gpu_options(spec.gpu_uuids),
        )
        if self.ssh_bundle:    # the node's sshd for an image without one, read-only
            kwargs["volumes"][self.ssh_bundle] = {"bind": BUNDLE_MOUNT, "mode": "ro"}
        if spec.volumes_path:  # network volumes (nodeagent/volumes.py), mounted later appear too
            kwargs["volumes"][spec.volumes_path] = {"bind": VOLUMES, "mode": "rw,rslave"}
        container = self._call(self.client.containers.create, **kwargs)
        try:
            self._layer_on_lease_disk(container, spec)
        except OperationFailed:
            self._remove(container)        # never left to start with its layer on the node
            raise
        forget_other_layers(spec.disk_path, keep=container.id)
        return container

    def _layer_on_lease_disk(self, container, spec: InstanceSpec) -> None:
        """The container's overlay2 writable layer links to the lease's disk before it
        ever starts (instance_root.py); checked again before every start."""
        graph = container.attrs.get("GraphDriver") or {}
        if graph.get("Name") != STORAGE_DRIVER or not graph.get("Data", {}).get("UpperDir"):
            raise OperationFailed("runtime_error", f"dockerd's storage driver is "
                                  f"{graph.get('Name')!r}: instances need {STORAGE_DRIVER!r} "
                                  "(docker-daemon.json), whose writable layer can live on the "
                                  "lease's encrypted disk")
        changed = place_layer(graph["Data"]["UpperDir"], spec.disk_path, container.id)
        if changed:
            log.info("lease %s: writable layer on the lease's disk (%s)", spec.lease_id,
                     ", ".join(changed))

    def _no_restart_policy(self, container) -> None:
        """A container made by an older agent (`unless-stopped`) loses its restart
        policy: dockerd must never start it at boot, before its disk is mounted."""
        policy = container.attrs.get("HostConfig", {}).get("RestartPolicy", {}).get("Name")
        if policy not in ("", "no", None):
            log.info("lease %s: dropping restart policy %s", container.name, policy)
            self._call(container.update, restart_policy=NO_RESTART)

    def _wait_running(self, container, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            container.reload()
            if container.status == "running":
                return
            if container.status in ("exited", "dead"):
                break
            time.sleep(0.2)
        state = container.attrs.get("State") or {}
        raise OperationFailed("runtime_error", f"container {container.name} is {container.status}"
                              f" (exit {state.get('ExitCode')}; {state.get('Error') or 'no error'}"
                              "; its own log: /var/log/instance.log inside)")

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

    def _require_image(self, spec: InstanceSpec) -> None:
        """The image is on the node, or a pull runs beside the loop (`image_pulling`, not a
        failure: the lease is retried every round until the image is there). A customer's
        image is pulled once per agent process and credentials even when present
        (images.py); a failed pull is named, and tried again after a back-off."""
        ref = spec.image
        if spec.customer_image and not self.config.pull_images:
            raise OperationFailed("image_missing", "this node does not pull images "
                                  "([docker] pull_images = false): only its own templates run")
        try:
            self.client.images.get(ref)
            if not spec.customer_image or self.puller.verified(ref, spec.registry_auth):
                return
        except ImageNotFound:
            if not self.config.pull_images:
                raise OperationFailed("image_missing",
                                      f"image {ref!r} is not on this node") from None
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker: {exc}") from exc
        failure = self.puller.failure(ref, spec.registry_auth)
        if failure:
            code, message = failure
            if code == "image_missing":
                message = f"image {ref!r} is not on this node and pulling it failed: {message}"
            raise OperationFailed(code, message)
        self.puller.request(ref, auth=spec.registry_auth, max_bytes=spec.image_max_bytes,
                            verify=spec.customer_image)
        raise OperationFailed(IMAGE_PULLING, f"image {ref!r} is being pulled")

    # -- isolation -----------------------------------------------------------------------
    def _ensure_network(self, lease_id: int) -> str:
        """The lease's own bridge network: no neighbour on its L2 segment."""
        name = container_name(lease_id)
        if not self._call(self.client.networks.list, names=[name]):
            self._call(self.client.networks.create, name, driver="bridge",
                       labels={LABEL_LEASE: str(lease_id)},
                       options={"com.docker.network.bridge.name": bridge_name(lease_id),
                                "com.docker.network.bridge.enable_icc": "false"})
        return name

    def _remove_network(self, lease_id: int) -> None:
        for network in self._call(self.client.networks.list, names=[container_name(lease_id)]):
            try:
                network.remove()
            except NotFound:
                pass
            except APIError as exc:
                raise OperationFailed("runtime_error", f"remove network: {exc}") from exc

    def _sync_filter(self, force: bool = False) -> None:
        # the plain listing (no inspect per container: cheap, and no race with a removal)
        containers = self._call(self.client.api.containers, all=True,
                                filters={"label": LABEL_LEASE})
        rules = [LeaseRule(int(c["Labels"][LABEL_LEASE]), int(c["Labels"][LABEL_PORT]),
                           self._port_rules(int(c["Labels"][LABEL_LEASE]), c["Labels"]))
                 for c in containers]
        for lease_id, before in self.filter.ensure(rules, force_check=force).items():
            if before is not None:
                self.egress.observe(lease_id, before)
            self.egress.observe(lease_id, 0)          # a new counter starts from zero

    def _remapped_root(self, required: bool) -> int:
        """The host uid of container root: dockerd's `userns-remap` range (its data root
        is then `<uid>.<gid>`), or 0 without a user namespace."""
        info = self._call(self.client.info)
        if any("name=userns" in opt for opt in info.get("SecurityOptions") or ()):
            return int(os.path.basename(info["DockerRootDir"]).split(".")[0])
        if required:
            raise OperationFailed("runtime_error", "dockerd runs without userns-remap: "
                                  "container root would be host root (see nodeagent/README.md, "
                                  "or set docker.require_userns = false for development)")
        return 0

    def _own_workspace(self, path: str) -> None:
        """The lease's disk belongs to container root (a remapped uid on the host)."""
        if self.root_uid and os.stat(path).st_uid == 0:
            os.chown(path, self.root_uid, self.root_uid)

    @staticmethod
    def _call(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DockerException as exc:
            raise OperationFailed("runtime_error", f"docker: {exc}") from exc


