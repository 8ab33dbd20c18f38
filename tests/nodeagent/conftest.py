"""Real parts for the node agent's tests, on a machine without a GPU:

- `nvml_stub`: libnvidia-ml.so.1 built here with gcc from nvml_stub/, so pynvml's real
  code path runs (loaded through LD_LIBRARY_PATH in a subprocess).
- `netns`: two network namespaces of our own joined by a veth pair: "node" (where the
  private dockerd, its bridge and its published ports live) and "client" (where the
  customer's ssh comes from). No address is added to the host's own namespace.
- `dockerd`: a private Docker daemon configured as a production node (nodeagent/README.md
  "Node setup"): `--userns-remap=default`, `--iptables=false`, no default bridge, its own
  socket, exec root and data root — ext4 on a loop device, with the production storage
  driver overlay2 (each instance's writable layer then lives on its lease's disk:
  nodeagent/runtime/instance_root.py), and the image file is one of the "node's block
  devices" the tenant-bytes scans search — started inside the node namespace and in a
  mount namespace whose /dev holds stand-in GPU nodes /dev/nvidia0..7 (private_dev.sh). That namespace is a slave of the host's and
  the tests' files are below a shared mount (`node_tmp_root`), so dockerd sees the
  agent's mounts there (lease disks, network volumes) as on a node. Every lease gets its own bridge network
  from `LEASE_POOL`; the agent's nftables table goes into the node namespace.
- `instance_image`: the debootstrap + openssh-server image (scripts/build-node-test-image.sh,
  cached across runs) imported into that daemon.
"""
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.config import DockerConfig
from nodeagent.converge import Converger
from nodeagent.directory_disks import DirectoryDisks
from nodeagent.journal import Journal
from nodeagent.outbox import Outbox
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.signing import NodeKey
from tests.deadlines import Deadline, scaled
from tests.tools import require, require_tool

from .agent_process import IMAGE_SLUG, STUB_GPUS
from .helpers import RecordingRuntime
from .outage_proxy import OutageProxy
from .storefront_double import StorefrontDouble

ROOT = Path(__file__).resolve().parents[2]
STUB_SOURCE = Path(__file__).parent / "nvml_stub" / "nvml_stub.c"
CUDA_STUB_SOURCE = Path(__file__).parent / "cuda_stub" / "cuda_stub.c"
IMAGE_SCRIPT = ROOT / "scripts" / "build-node-test-image.sh"
LEASE_POOL = "10.213.0.0/16"             # per-lease /28 networks, node namespace only
PRIVATE_DEV = Path(__file__).parent / "private_dev.sh"
STAND_IN_GPUS = tuple(f"/dev/nvidia{i}" for i in range(8))   # see private_dev.sh


def stand_in_devices(uuids) -> dict[str, str]:
    """`[docker.gpu_devices]` for these GPU UUIDs: the i-th gets /dev/nvidia<i>."""
    return {uuid: STAND_IN_GPUS[i] for i, uuid in enumerate(uuids)}


DATA_FS_BYTES = 8 * 1024 ** 3            # sparse


@pytest.fixture(scope="session")
def nvml_stub(tmp_path_factory) -> Path:
    """The directory holding the stub libnvidia-ml.so.1 and the stub libcuda.so.1 (the GPU
    memory clearing routine's, cuda_stub/), for LD_LIBRARY_PATH."""
    gcc = require_tool("gcc")
    out = tmp_path_factory.mktemp("nvml")
    for library, source in (("libnvidia-ml.so.1", STUB_SOURCE), ("libcuda.so.1", CUDA_STUB_SOURCE)):
        subprocess.run([gcc, "-shared", "-fPIC", "-Wall", "-Werror", "-O2", "-o",
                        str(out / library), str(source)], check=True)
    return out


@pytest.fixture(scope="session")
def node_tmp_root():
    """Temporary files of the node tests, outside /tmp/pytest-of-root (which every pytest
    session resets to 0700): container root is an unprivileged host uid under
    userns-remap and must pass through the directories above its data root and the lease
    disks (search only, mode 0711), as on a node where /var/lib/docker is 0711.

    It is a shared mount (see `_share_mounts_below`), so that what the agent mounts here
    in the host's namespace reaches the private dockerd's."""
    root = Path(tempfile.mkdtemp(prefix=f"gna-{os.getpid()}-", dir="/tmp"))
    root.chmod(0o711)
    _share_mounts_below(root)
    try:
        yield root
    finally:
        # lazily: also detaches whatever a failed test left mounted below, so rm sees
        # only the plain directories underneath
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)])


def _share_mounts_below(root: Path) -> None:
    """Make `root` a mount point of its own with shared propagation. On a node systemd
    makes / shared and dockerd runs in the host's mount namespace, so it sees the lease
    disks the agent mounts and accepts the `rslave` bind of a lease's /volumes (its source
    must be on a shared or slave mount). Here / is private and the test dockerd runs in a
    mount namespace of its own (private_dev.sh), a slave of the host's: only mounts made
    below a shared mount reach a slave, so the tests' files live below this one."""
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True, capture_output=True)
    subprocess.run(["mount", "--make-rshared", str(root)], check=True, capture_output=True)


@pytest.fixture
def tmp_path(node_tmp_root, request):
    """pytest's tmp_path, under `node_tmp_root` (see there)."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:40]
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=node_tmp_root))
    path.chmod(0o711)
    return path


@dataclass
class NetNamespaces:
    node: str
    client: str
    node_ip: str
    client_ip: str

    def in_client(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.client, *argv]


@pytest.fixture(scope="session")
def netns():
    require_tool("ip", "iproute2")
    # Random, not the pid: tests/storage re-imports this session fixture, so one process can
    # hold two instances at once, and one's teardown must not delete the other's namespaces.
    suffix = secrets.token_hex(3)
    octet = 1 + secrets.randbelow(250)
    spaces = NetNamespaces(node=f"gna-node-{suffix}", client=f"gna-client-{suffix}",
                           node_ip=f"192.168.{octet}.1", client_ip=f"192.168.{octet}.2")
    veth_node, veth_client = f"gnan{suffix}", f"gnac{suffix}"
    steps = [
        ["ip", "netns", "add", spaces.node],
        ["ip", "netns", "add", spaces.client],
        ["ip", "link", "add", veth_node, "netns", spaces.node, "type", "veth",
         "peer", "name", veth_client, "netns", spaces.client],
    ]
    for ns, veth, ip in ((spaces.node, veth_node, spaces.node_ip),
                         (spaces.client, veth_client, spaces.client_ip)):
        steps += [["ip", "-n", ns, "link", "set", "lo", "up"],
                  ["ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", veth],
                  ["ip", "-n", ns, "link", "set", veth, "up"]]
    try:
        for argv in steps:
            subprocess.run(argv, check=True, capture_output=True)
        yield spaces
    finally:
        for ns in (spaces.client, spaces.node):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@dataclass
class PrivateDockerd:
    socket: str                  # unix:///…/docker.sock
    pid: int
    data_image: Path | None = None   # the file holding its data root's ext4 (a "block device")

    def client(self):
        import docker
        return docker.DockerClient(base_url=self.socket, timeout=120)


@pytest.fixture(scope="session")
def dockerd(netns, node_tmp_root):
    dockerd_bin = require_tool("dockerd", "docker.io")
    require_tool("docker", "docker.io")
    nsenter = require_tool("nsenter", "util-linux")
    unshare = require_tool("unshare", "util-linux")
    require_tool("nft", "nftables")
    mkfs = require_tool("mkfs.ext4", "e2fsprogs")
    require(_has_subordinate_ids("dockremap"), "no dockremap user with /etc/subuid and "
            "/etc/subgid ranges (scripts/install-node-tools.sh makes them)")
    home = node_tmp_root / "dockerd"
    home.mkdir(mode=0o711)
    exec_root = Path(f"/tmp/gna{secrets.token_hex(3)}")   # short: unix socket paths are limited
    sock = home / "docker.sock"
    data = home / "data"
    image = home / "data.ext4"
    with open(image, "wb") as sparse:
        sparse.truncate(DATA_FS_BYTES)
    subprocess.run([mkfs, "-q", "-F", str(image)], check=True, capture_output=True)
    data.mkdir()
    host_dev = home / "host-dev"
    host_dev.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(data)], check=True,
                   capture_output=True)
    log = open(home / "dockerd.log", "wb")
    process = subprocess.Popen(
        [unshare, "--mount", "--propagation", "slave", str(PRIVATE_DEV), str(host_dev),
         nsenter, f"--net=/run/netns/{netns.node}", dockerd_bin, "--bridge=none",
         "--iptables=false", "--ip6tables=false", "--userns-remap=default",
         "--storage-driver=overlay2", "--log-driver=none",
         "--default-address-pool", f"base={LEASE_POOL},size=28",
         "--data-root", str(data), "--exec-root", str(exec_root), "-H", f"unix://{sock}",
         "--shutdown-timeout", "2", "--pidfile", str(home / "docker.pid")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    daemon = PrivateDockerd(socket=f"unix://{sock}", pid=process.pid, data_image=image)
    try:
        _wait_for_daemon(daemon, process, home / "dockerd.log")
        yield daemon
    finally:
        _stop_daemon(daemon, process)
        log.close()
        # dockerd leaves its netns bind mount behind; under userns-remap it also makes
        # <exec root>.<uid>.<gid> beside the exec root
        for root in (exec_root, *exec_root.parent.glob(f"{exec_root.name}.*")):
            _unmount_under(root)
            shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["umount", "-l", str(data)], capture_output=True)
        image.unlink(missing_ok=True)


def _wait_for_daemon(daemon, process, log_path, timeout=60):
    """Until dockerd answers a ping, within `timeout` unloaded seconds (tests/deadlines.py)."""
    deadline = Deadline(timeout)
    while not deadline.expired():
        if process.poll() is not None:
            pytest.fail(f"dockerd exited: {log_path.read_text()[-2000:]}")
        try:
            if daemon.client().ping():
                return
        except Exception:
            time.sleep(0.3)
    pytest.fail(f"dockerd did not answer within {timeout} unloaded seconds ({deadline.waited:.0f} s waited): "
                f"{log_path.read_text()[-2000:]}")


def _unmount_under(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mountpoint in sorted((m for m in mounts if m.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", "-l", mountpoint], capture_output=True)


def _has_subordinate_ids(user: str) -> bool:
    try:
        return all(any(line.split(":")[0] == user for line in Path(f).read_text().splitlines())
                   for f in ("/etc/subuid", "/etc/subgid"))
    except FileNotFoundError:
        return False


def _stop_daemon(daemon, process):
    try:
        for container in daemon.client().containers.list(all=True):
            container.remove(force=True)
    except Exception:
        pass
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def instance_image(dockerd) -> str:
    """The instance image's reference in the private daemon (built once, cached)."""
    require_tool("debootstrap")
    build = subprocess.run([str(IMAGE_SCRIPT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    tarball = Path(build.stdout.strip())
    ref = f"gpu-node-test:{tarball.stem.rsplit('-', 1)[-1]}"
    with open(tarball, "rb") as data:
        dockerd.client().api.import_image_from_data(data, repository=ref.split(":")[0],
                                                   tag=ref.split(":")[1])
    return ref


@pytest.fixture
def ssh_key(tmp_path):
    """A customer's key pair: (private key path, public key line)."""
    keygen = require_tool("ssh-keygen", "openssh-client")
    path = tmp_path / "customer_ed25519"
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "alice@example.org",
                    "-f", str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


def ssh_argv(netns: NetNamespaces, key: Path, port: int, command: str) -> list[str]:
    """ssh from the client namespace to the node's published port."""
    return netns.in_client(
        "ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", f"root@{netns.node_ip}", command)


def ssh_run(netns, key, port, command, *, attempts: int | None = None,
            within: float = 30) -> subprocess.CompletedProcess:
    """Run `command` over ssh, retrying while sshd is still starting: for `within` unloaded
    seconds (tests/deadlines.py: a fixed 40 tries ran out at load 3 before an image's sshd
    listened), or exactly `attempts` tries when given (1: to see a refusal)."""
    deadline, tries = Deadline(within), 0
    while True:
        result = subprocess.run(ssh_argv(netns, key, port, command), capture_output=True,
                                text=True, timeout=scaled(30))
        tries += 1
        if result.returncode != 255:       # 255: ssh itself failed (refused, no route)
            return result
        if tries == attempts or (attempts is None and deadline.expired()):
            return result
        time.sleep(0.5)


@pytest.fixture
def storefront():
    """The agent protocol's storefront side, a double serving one test (storefront_double.py)."""
    double = StorefrontDouble()
    double.start()
    yield double
    double.stop()


# The converger's tests (test_converge.py, the image and workbench tests)
@pytest.fixture
def node_state(tmp_path, dockerd, instance_image):
    config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                          gpu_devices=stand_in_devices(STUB_GPUS),
                          port_range=(22300, 22399), published_port_range=(23300, 23399),
                          stop_timeout=2)
    key = NodeKey.generate(tmp_path / "key.pem")
    made = []

    def converger():
        """A freshly started agent's converger over the same state directory."""
        runtime = RecordingRuntime(DockerRuntime(config, tmp_path / "runtime"))
        made.append(runtime)
        return Converger(node="n1", runtime=runtime, disks=DirectoryDisks(tmp_path / "disks"),
                         journal=Journal(tmp_path / "journal.json"),
                         outbox=Outbox(tmp_path / "outbox.json"), key=key,
                         images={IMAGE_SLUG: instance_image}, public_host="192.0.2.10")
    yield converger, Outbox(tmp_path / "outbox.json")
    for lease_id in made[0].runtime.lease_ids():
        made[0].runtime.ensure_absent(lease_id)


@pytest.fixture
def live_storefront(live_server, settings, catalog):
    """The real storefront (live server, NodeAgentDriver) behind a proxy the test can take down."""
    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    settings.NODE_POLL_SECONDS = 1
    host, port = live_server.thread.host, live_server.thread.port
    proxy = OutageProxy(host, port)
    proxy.up()
    yield proxy
    proxy.down()
