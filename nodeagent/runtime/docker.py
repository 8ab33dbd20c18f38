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
(`"devices"`, for tests and unusual hosts)."""
import hashlib
import io
import json
import logging
import os
import shlex
import subprocess
import tarfile
import time

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest, LogConfig

from ..config import DockerConfig
from ..gpu_attachment import PROBE, parse_probe
from ..interfaces import InstanceSpec, InstanceStatus, OperationFailed
from ..netfilter import LeaseRule, PacketFilter, PortRule, bridge_name, socket_peer_pid
from .egress import EgressMeter
from .images import ImagePuller
from .instance_root import INSTANCE_ROOT, etc_binds, forget_other_layers, place_layer
from .ports import BAD_PORTS, SSHD_PORT, AllowBook, PortBook, PublishedPortBook, normalise_networks
from .ssh_bundle import BUNDLE_MOUNT, ENV_FILE, LAUNCHER, build_bundle

log = logging.getLogger(__name__)

LABEL_LEASE = "gpu-node-agent.lease"
LABEL_SPEC = "gpu-node-agent.spec"
LABEL_PORT = "gpu-node-agent.ssh-port"
# The customer's published ports, {"<container port>": <host port>} (JSON): what the packet
# filter opens, and what a lost port book must not hand out again.
LABEL_PUBLISHED = "gpu-node-agent.published-ports"
WORKSPACE = "/workspace"
# Only the agent starts a container, after it mounted the lease's disk: with a
# restart policy dockerd would start it at boot onto the bare mount point.
NO_RESTART = {"Name": "no"}
IMAGE_PULLING = "image_pulling"     # not a failure: reported until the pull is done
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
NFT_FILE = "nftables.nft"  # the table as last written, for nftables.service at boot
# 1: own network per lease, device paths kept; 2: writable layer, /etc files on the
# lease's disk, no logs (a container made by an older agent is recreated, its disk kept)
ISOLATION_VERSION = 2
STORAGE_DRIVER = "overlay2"      # the writable layer's directories can move (instance_root.py)
NO_LOGS = LogConfig(type="none")  # PID 1's output (sshd, or a tenant writing to it) is not kept
# The instance's view of its disk hides the agent's directory there behind this mount.
MASK = {f"{WORKSPACE}/{INSTANCE_ROOT}": "ro,size=4k,mode=0555"}


class DockerRuntime:
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

    def _published_by_others(self, *, but: int) -> frozenset[int]:
        """Host ports the other instances publish for their customers (their labels)."""
        containers = self._call(self.client.containers.list, all=True, filters={"label": LABEL_LEASE})
        return frozenset(port for c in containers if c.labels[LABEL_LEASE] != str(but)
                         for _, port in _published(c.labels))

    @property
    def max_published_ports(self) -> int:
        return self.config.max_published_ports

    def _check_ports(self, spec: InstanceSpec) -> None:
        """The node's limits, before anything of the instance changes."""
        wanted = [p.port for p in spec.ports]
        if len(wanted) > self.config.max_published_ports:
            raise OperationFailed(BAD_PORTS, f"{len(wanted)} published ports asked; "
                                  f"this node publishes at most {self.config.max_published_ports}")
        if SSHD_PORT in wanted:
            raise OperationFailed(BAD_PORTS, f"port {SSHD_PORT} is the instance's sshd")

    def _publish(self, spec: InstanceSpec) -> dict[int, int]:
        """The customer's ports: container port -> host port."""
        return self.published.ports_for(spec.lease_id, [p.port for p in spec.ports],
                                        taken=self._published_by_others(but=spec.lease_id))

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

    def _port_rules(self, lease_id: int, labels: dict) -> tuple[PortRule, ...]:
        """The lease's published ports with their allowed sources. A list that no longer
        parses (the state file edited by hand) closes that port, never the whole table."""
        allows = self.allows.get(lease_id)
        rules = []
        for container_port, host_port in _published(labels):
            try:
                allow = normalise_networks(allows.get(container_port, ()))
            except (TypeError, ValueError) as exc:
                log.error("lease %s: port %s's allowed sources are unreadable (%s): closed",
                          lease_id, container_port, exc)
                allow = ()
            rules.append(PortRule(host_port, container_port, allow))
        return tuple(rules)

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


def _published(labels: dict) -> tuple[tuple[int, int], ...]:
    """(container port, host port) pairs from a container's label; none if unreadable."""
    try:
        ports = json.loads(labels.get(LABEL_PUBLISHED) or "{}")
        return tuple(sorted((int(c), int(h)) for c, h in ports.items()))
    except (TypeError, ValueError, AttributeError):
        return ()


def _published_label(published: dict[int, int]) -> dict[str, str]:
    if not published:
        return {}
    return {LABEL_PUBLISHED: json.dumps({str(c): h for c, h in sorted(published.items())})}


