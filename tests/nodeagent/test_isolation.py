"""Two tenants on one node, for real: the private userns-remapped dockerd in
the node namespace, the agent's nftables table, the debootstrap image. From tenant A's
instance, as root, everything an attacker-customer would try fails — B's sshd on the
bridge and on its published port, a listener on the node, the management network and the
metadata address, raw sockets, mknod of B's GPU, host secrets in
/proc and /sys — while A still reaches the internet (the client namespace) and B and the
node keep working. The same after the rules were flushed by hand and after an agent
restart. Egress counts only what left the node. (Filling a writable layer, and where a
tenant's bytes go: test_tenant_bytes.py.)"""
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nodeagent.config import AgentConfig, ConfigError, DockerConfig, parse_config
from nodeagent.directory_disks import DirectoryDisks
from nodeagent.interfaces import InstanceSpec
from nodeagent.netfilter import TABLE, FilterGuard
from nodeagent.runtime.container_options import CAPABILITIES
from nodeagent.runtime.docker import DockerRuntime
from tests import deadlines
from tests.tools import require_tool

from .conftest import ssh_run, stand_in_devices
from .netprobe import Sink, tcp_open, udp_arrives, udp_dropped

SINK = Path(__file__).parent / "sink.py"
GPUS = ("GPU-15014710-0000-4000-8000-00000000000a", "GPU-15014710-0000-4000-8000-00000000000b")
METADATA = "169.254.169.254"
# CAP_* bit numbers of CAPABILITIES (linux/capability.h)
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
            "SETUID": 7, "NET_BIND_SERVICE": 10, "SYS_CHROOT": 18, "AUDIT_WRITE": 29}


class Listener:
    """sink.py in a network namespace: its port and the byte counts it received."""

    def __init__(self, netns_name: str, directory: Path):
        self.log = Path(tempfile.mkstemp(dir=directory, suffix=".log")[1])
        self.process = subprocess.Popen(["ip", "netns", "exec", netns_name, sys.executable,
                                         str(SINK), str(self.log)], stdout=subprocess.PIPE,
                                        text=True)
        self.port = int(self.process.stdout.readline())

    def received(self) -> list[int]:
        return [int(n) for n in self.log.read_text().split()]

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


class Tenants:
    def __init__(self, runtime_factory, netns, key, listeners, mgmt_ip):
        self.new_runtime = runtime_factory
        self.runtime = runtime_factory()
        self.netns, self.key, self.mgmt_ip = netns, key, mgmt_ip
        self.internet, self.node_service = listeners

    def address(self, lease_id) -> tuple[str, str]:
        """(instance address, its gateway) on the lease's own network."""
        net = self.runtime.client.api.inspect_container(f"lease-{lease_id}")[
            "NetworkSettings"]["Networks"][f"lease-{lease_id}"]
        return net["IPAddress"], net["Gateway"]

    def port(self, lease_id) -> int:
        return self.runtime.status(lease_id).ssh_port

    def sh(self, lease_id, command) -> tuple[int, str]:
        container = self.runtime.client.containers.get(f"lease-{lease_id}")
        result = container.exec_run(["/bin/bash", "-c", command])
        return result.exit_code, result.output.decode(errors="replace")

    def reachable(self, lease_id, targets) -> dict[str, bool]:
        """TCP connect from the instance to each "host:port", in parallel (3 s each)."""
        probes = " ".join(
            f"(timeout 3 bash -c 'exec 3<>/dev/tcp/{t.replace(':', '/')}' 2>/dev/null "
            f"&& echo '{t} open' || echo '{t} closed') &" for t in targets)
        _, out = self.sh(lease_id, f"{probes} wait")
        found = dict(line.rsplit(" ", 1) for line in out.splitlines() if line.strip())
        return {t: found.get(t) == "open" for t in targets}

    def attacks_from_a(self) -> dict[str, bool]:
        b_ip, b_gateway = self.address(B)
        _, a_gateway = self.address(A)
        node_port, b_port = self.node_service.port, self.port(B)
        return self.reachable(A, [
            f"{b_ip}:22",                               # B's sshd on its bridge
            f"{a_gateway}:{b_port}",                    # B's published port via the gateway
            f"{self.netns.node_ip}:{b_port}",           # ... and via the node's address
            f"{b_gateway}:{b_port}",
            f"{a_gateway}:{node_port}",                 # a service listening on the node
            f"{self.netns.node_ip}:{node_port}",
            f"{self.mgmt_ip}:{self.internet.port}",     # the management network
            f"{METADATA}:{self.internet.port}",         # link-local / cloud metadata
        ])

    def assert_isolated(self):
        attacks = self.attacks_from_a()
        assert not any(attacks.values()), attacks
        internet = f"{self.netns.client_ip}:{self.internet.port}"
        assert self.reachable(A, [internet]) == {internet: True}   # A itself still works
        self.assert_b_and_node_work()

    def assert_b_and_node_work(self):
        login = ssh_run(self.netns, self.key, self.port(B), "echo b-alive")
        assert login.returncode == 0 and login.stdout == "b-alive\n", login.stderr
        node = subprocess.run(self.netns.in_client(
            "timeout", "3", "bash", "-c",
            f"exec 3<>/dev/tcp/{self.netns.node_ip}/{self.node_service.port}; echo up >&3"),
            capture_output=True, text=True)
        assert node.returncode == 0, node.stderr                 # the node's service answers


A, B = 41, 42


@pytest.fixture(scope="module")
def tenants(dockerd, netns, instance_image, node_tmp_root):
    require_tool("ssh", "openssh-client")
    require_tool("nft", "nftables")
    work = Path(tempfile.mkdtemp(prefix="isolation-", dir=node_tmp_root))
    work.chmod(0o711)
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    octet = netns.node_ip.split(".")[2]
    mgmt_ip = f"10.99.{octet}.1"            # a management host stand-in, beyond the client
    routes = [f"{mgmt_ip}/32", f"{METADATA}/32"]
    for address in routes:
        subprocess.run(["ip", "-n", netns.client, "addr", "add", address, "dev", "lo"],
                       check=True)
        subprocess.run(["ip", "-n", netns.node, "route", "add", address, "via",
                        netns.client_ip], check=True)
    listeners = (Listener(netns.client, work), Listener(netns.node, work))
    config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                          gpu_devices=stand_in_devices(GPUS), port_range=(22700, 22799),
                          stop_timeout=2,
                          blocked_networks=(f"10.99.{octet}.0/24",))
    tenants = Tenants(lambda: DockerRuntime(config, work / "runtime"), netns, key,
                      listeners, mgmt_ip)
    disks = DirectoryDisks(work / "disks")
    public_key = key.with_suffix(".pub").read_text().strip()
    try:
        for lease_id, gpu in ((A, GPUS[0]), (B, GPUS[1])):
            tenants.runtime.ensure_running(InstanceSpec(
                lease_id=lease_id, image=instance_image, gpu_uuids=(gpu,),
                ssh_authorized_keys=(public_key,), cpus=1, memory_gb=1, shm_gb=1,
                disk_path=disks.ensure_ready(lease_id, 10)))
        for lease_id in (A, B):       # both sshds listen before any test probes them
            assert ssh_run(netns, key, tenants.port(lease_id), "true").returncode == 0
        yield tenants
    finally:
        for lease_id in tenants.runtime.lease_ids():
            tenants.runtime.ensure_absent(lease_id)
        for listener in listeners:
            listener.stop()
        for address in routes:
            subprocess.run(["ip", "-n", netns.node, "route", "del", address])
            subprocess.run(["ip", "-n", netns.client, "addr", "del", address, "dev", "lo"])


def nft_in_node(netns, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", netns.node, "nft", *args],
                          capture_output=True, text=True)


def test_a_reaches_the_internet_and_nothing_else_on_the_node(tenants):
    tenants.assert_isolated()
    # the lease networks are separate bridges, one instance each, ICC off
    for lease_id in (A, B):
        network = tenants.runtime.client.api.inspect_network(f"lease-{lease_id}")
        assert network["Options"]["com.docker.network.bridge.name"] == f"gl{lease_id}"
        assert network["Options"]["com.docker.network.bridge.enable_icc"] == "false"
        assert len(network["Containers"]) == 1
    # from outside, the instance's own address is closed even with a route to it: only
    # the published ssh port (the proxy on the node) leads in
    a_ip, _ = tenants.address(A)
    netns = tenants.netns
    route = ["ip", "-n", netns.client, "route", "add", f"{a_ip}/32", "via", netns.node_ip]
    subprocess.run(route, check=True)
    try:
        direct = subprocess.run(netns.in_client(
            "timeout", "3", "bash", "-c", f"exec 3<>/dev/tcp/{a_ip}/22"), capture_output=True)
        assert direct.returncode != 0
    finally:
        subprocess.run([*route[:4], "del", *route[5:]])
    assert ssh_run(netns, tenants.key, tenants.port(A), "true").returncode == 0
    subnets = {tenants.runtime.client.api.inspect_network(f"lease-{lease_id}")["IPAM"][
        "Config"][0]["Subnet"] for lease_id in (A, B)}
    assert len(subnets) == 2


def test_root_in_a_has_no_raw_socket_mknod_or_host_privilege(tenants):
    assert_unprivileged(tenants)


def assert_unprivileged(tenants):
    raw = tenants.sh(A, "perl -MSocket -e 'socket(S, PF_INET, SOCK_RAW, 1) or die \"$!\\n\"'")
    assert raw[0] != 0 and "Operation not permitted" in raw[1]
    # B's GPU is /dev/nvidia1 (char 1:5): A can neither make its node nor find it
    mknod = tenants.sh(A, "mknod /tmp/gpu1 c 1 5")
    assert mknod[0] != 0 and "Operation not permitted" in mknod[1]
    assert tenants.sh(A, "ls /dev/nvidia*") == (0, "/dev/nvidia0\n")
    assert tenants.sh(A, "echo x > /dev/nvidia0 && echo own-gpu-ok") == (0, "own-gpu-ok\n")
    status = dict(re.findall(r"^(\w+):\s+(\S+)", tenants.sh(A, "cat /proc/self/status")[1],
                             re.M))
    assert int(status["CapEff"], 16) == sum(1 << CAP_BITS[c] for c in CAPABILITIES)
    assert int(status["CapBnd"], 16) == int(status["CapEff"], 16)
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"      # filter mode
    # root in the instance is an unprivileged host uid
    inside, host, _ = tenants.sh(A, "cat /proc/self/uid_map")[1].split()
    assert inside == "0" and int(host) == tenants.runtime.root_uid > 0
    pid = tenants.runtime.client.api.inspect_container(f"lease-{A}")["State"]["Pid"]
    assert os.stat(f"/proc/{pid}").st_uid == tenants.runtime.root_uid


def test_a_finds_no_host_secrets_in_proc_or_sys(tenants, netns):
    secret = os.urandom(12).hex()
    holder = subprocess.Popen(["ip", "netns", "exec", netns.node, "sleep", "60"],
                              env={**os.environ, "GNA_HOST_SECRET": secret})
    try:
        # on the host the secret is plainly there: the search below can find it
        deadlines.wait_for(lambda: any(secret in Path(f"/proc/{p}/environ").read_text(errors="replace")
                                       for p in _pids_of(holder.pid)), 10, "the secret in the holder's environ",
                           ignore=(OSError,))
        # (the pattern from a file: no command line in A holds the secret in one piece)
        code, out = tenants.sh(A, f"printf %s%s {secret[:12]} {secret[12:]} > /tmp/pattern; "
                                  "grep -rls -f /tmp/pattern /proc/*/environ /proc/*/cmdline "
                                  "/sys/fs/cgroup 2>/dev/null; echo searched")
        assert out.strip() == "searched"
    finally:
        holder.kill()
        holder.wait()
    # masked or read-only: kernel memory, keys, firmware tables, kernel knobs
    assert tenants.sh(A, "head -c1 /proc/kcore 2>/dev/null | wc -c")[1].strip() == "0"
    assert tenants.sh(A, "cat /proc/keys; ls /sys/firmware")[1].strip() == ""
    knob = tenants.sh(A, "echo '|/tmp/x' > /proc/sys/kernel/core_pattern")
    assert knob[0] != 0 and "Read-only file system" in knob[1]
    assert tenants.sh(A, "ls /var/run/docker.sock /run/docker.sock 2>&1 | grep -c 'No such'")[
        1].strip() == "2"


def _pids_of(root_pid: int) -> list[int]:
    """`root_pid` and its children (ip netns exec execs sleep, normally the same pid)."""
    pids = [root_pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f" {root_pid} " in (entry / "stat").read_text().rsplit(")", 1)[1][:20]:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_rules_flushed_by_hand_are_restored_by_the_next_round(tenants, netns):
    assert nft_in_node(netns, "flush", "ruleset").returncode == 0
    # without the table the node is wide open (what the test guards against)
    b_ip, _ = tenants.address(B)
    _, a_gateway = tenants.address(A)
    open_now = tenants.reachable(A, [f"{b_ip}:22", f"{a_gateway}:{tenants.node_service.port}"])
    assert all(open_now.values()), open_now
    time.sleep(1.1)                                   # the filter is checked once a second
    tenants.runtime.status(A)                         # the agent's next round
    assert nft_in_node(netns, "list", "table", "inet", TABLE).returncode == 0
    assert tenants.runtime.filter.restored >= 1
    tenants.assert_isolated()


def test_a_restarted_agent_writes_the_rules_before_anything_else(tenants, netns):
    assert nft_in_node(netns, "flush", "ruleset").returncode == 0
    tenants.runtime = tenants.new_runtime()           # agent restart (or a reboot: no table)
    assert nft_in_node(netns, "list", "table", "inet", TABLE).returncode == 0
    tenants.assert_isolated()
    assert_unprivileged(tenants)
    assert tenants.runtime.lease_ids() == [A, B]
    # the saved copy (for nftables.service at boot) loads into a fresh namespace as is
    fresh = f"gna-boot-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", fresh], check=True)
    try:
        saved = tenants.runtime.filter.saved_path
        load = subprocess.run(["ip", "netns", "exec", fresh, "nft", "-f", str(saved)],
                              capture_output=True, text=True)
        assert load.returncode == 0, load.stderr
        listed = subprocess.run(["ip", "netns", "exec", fresh, "nft", "list", "table", "inet",
                                 TABLE], capture_output=True, text=True).stdout
        assert f'"gl{A}" : "egress_{A}"' in listed and "@blocked4" in listed
    finally:
        subprocess.run(["ip", "netns", "del", fresh])


def test_egress_counts_only_traffic_that_left_the_node(tenants):
    before_a, before_b = tenants.runtime.status(A).egress_bytes, tenants.runtime.status(B).egress_bytes
    sent = tenants.sh(A, f"head -c 500000 /dev/urandom > /dev/tcp/{tenants.netns.client_ip}/"
                         f"{tenants.internet.port} && echo sent")
    assert sent == (0, "sent\n")
    deadlines.wait_for(lambda: 500000 in tenants.internet.received(), 10, "500 kB at the internet's end", every=0.2)
    after_internet = tenants.runtime.status(A).egress_bytes
    assert 500000 <= after_internet - before_a < 600000          # payload + headers

    b_ip, _ = tenants.address(B)
    _, a_gateway = tenants.address(A)
    for target in (f"{b_ip}/22", f"{a_gateway}/{tenants.node_service.port}",
                   f"{tenants.mgmt_ip}/{tenants.internet.port}"):
        tenants.sh(A, f"head -c 2000000 /dev/zero | timeout 4 bash -c 'cat > /dev/tcp/{target}'")
    # connection attempts to neighbours, node and management were dropped uncounted
    assert tenants.runtime.status(A).egress_bytes == after_internet
    assert tenants.runtime.status(B).egress_bytes == before_b
    # the total survives an agent restart
    tenants.runtime = tenants.new_runtime()
    assert tenants.runtime.status(A).egress_bytes == after_internet


def test_host_network_and_bad_blocked_networks_are_refused():
    with pytest.raises(ConfigError, match="own bridge network"):
        parse_config({"docker": {"network": "host"}})
    with pytest.raises(ConfigError, match="blocked_networks"):
        parse_config({"docker": {"blocked_networks": ["10.0.0.0/33"]}})
    parsed = parse_config({"docker": {"blocked_networks": ["192.0.2.7/24"]}})
    assert parsed.docker.blocked_networks == ("192.0.2.0/24",)


class Management:
    """The node's management network: a host in a namespace of its own behind a second
    interface of the node, with TCP and UDP listeners; UDP listeners on the public side."""

    def __init__(self, name, host, tcp, udp, public_udp):
        self.name, self.host, self.tcp, self.udp, self.public_udp = name, host, tcp, udp, public_udp


@pytest.fixture(scope="module")
def management(netns, node_tmp_root):
    """A veth from the node namespace to a third one, `mgmt`, whose host answers on
    10.99.<octet>.66 (inside the tenants' blocked range) and routes back through the node;
    the client (the public side) is given a route to it via the node, as anyone on the
    node's public segment can."""
    suffix = netns.node.rsplit("-", 1)[1]
    octet = netns.node_ip.split(".")[2]
    name, node_side, host = f"gna-mgmt-{suffix}", f"10.99.{octet}.65", f"10.99.{octet}.66"
    network = f"10.99.{octet}.64/30"
    work = Path(tempfile.mkdtemp(prefix="management-", dir=node_tmp_root))
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", f"gnam{suffix}", "netns", netns.node, "type", "veth",
         "peer", "name", f"gnma{suffix}", "netns", name],
        ["ip", "-n", netns.node, "addr", "add", f"{node_side}/30", "dev", f"gnam{suffix}"],
        ["ip", "-n", netns.node, "link", "set", f"gnam{suffix}", "up"],
        ["ip", "-n", name, "addr", "add", f"{host}/30", "dev", f"gnma{suffix}"],
        ["ip", "-n", name, "link", "set", f"gnma{suffix}", "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
        ["ip", "-n", name, "route", "add", "default", "via", node_side],
        ["ip", "-n", netns.client, "route", "add", network, "via", netns.node_ip],
    ]
    sinks = []
    try:
        for argv in steps:
            subprocess.run(argv, check=True, capture_output=True)
        sinks = [Sink(name, work), Sink(name, work, udp=True), Sink(netns.client, work, udp=True)]
        yield Management(name, host, *sinks)
    finally:
        for sink in sinks:
            sink.stop()
        subprocess.run(["ip", "-n", netns.client, "route", "del", network], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def assert_no_route_through_the_node(tenants, management):
    """Public side to management host and back, TCP and UDP: nothing crosses the node."""
    netns, m = tenants.netns, management
    connections = len(m.tcp.lines()), len(tenants.internet.received())
    assert not tcp_open(netns.client, m.host, m.tcp.port)
    assert udp_dropped(m.udp, netns.client, m.host, m.udp.port, node_netns=netns.node)
    assert not tcp_open(m.name, netns.client_ip, tenants.internet.port)
    assert udp_dropped(m.public_udp, m.name, netns.client_ip, m.public_udp.port,
                       node_netns=netns.node)
    assert (len(m.tcp.lines()), len(tenants.internet.received())) == connections


def test_the_node_routes_nothing_between_its_networks(tenants, management):
    netns, m = tenants.netns, management
    assert_no_route_through_the_node(tenants, m)
    tenants.assert_isolated()               # A still reaches the internet, B and the node work
    # Flushed by hand, the node routes again (dockerd turned ip_forward on): what the
    # forward chain's drop is for ...
    assert nft_in_node(netns, "flush", "ruleset").returncode == 0
    assert tcp_open(netns.client, m.host, m.tcp.port)
    assert udp_arrives(m.udp, netns.client, m.host, m.udp.port)
    # ... until the guard's next check (the agent runs it on its own timer), with nft only
    interval = AgentConfig().filter_guard_seconds
    guard = FilterGuard(tenants.runtime.filter, interval).start()
    try:
        deadlines.wait_for(
            lambda: nft_in_node(netns, "list", "table", "inet", TABLE).returncode == 0,
            3 * interval + 2, "the guard restoring the table", every=0.05)
        assert_no_route_through_the_node(tenants, m)
        tenants.assert_isolated()           # the round's filter use beside the guard's thread
    finally:
        guard.stop()
