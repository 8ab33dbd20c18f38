"""Customers' published ports for real: the private userns-remapped dockerd in the node
namespace, the agent's nftables table, the debootstrap image with a small server on the
instance's ports. Tenant A publishes 8888 for two source addresses of the client side
(one IPv4, one IPv6) and for the whole lease address pool, and 8000 for anyone; tenant B
publishes 8000 for anyone. From the client side an allowed source gets A's answer and a
source outside the list none (its SYN is dropped); from B's instance A's ports are never
reachable — not even 8888, whose list holds B's address, nor the ports open to anyone —
and the same from A towards B. A change of the list rewrites the filter alone (the same
container), the rules come back after `nft flush ruleset` and with a restarted agent, and
the host ports stay where they were across a restart, an added port and a lost port book
(whose agent closes the ports it has no list for)."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nodeagent.config import AgentConfig, DockerConfig
from nodeagent.directory_disks import DirectoryDisks
from nodeagent.interfaces import InstanceSpec, PublishedPort
from nodeagent.netfilter import TABLE, FilterGuard
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.ports import parse_ports
from nodeagent.runtime.published_ports import LABEL_PUBLISHED
from tests import deadlines
from tests.tools import require_tool

from ..conftest import LEASE_POOL, stand_in_devices

GPUS = ("GPU-15014710-0000-4000-8000-00000000001a", "GPU-15014710-0000-4000-8000-00000000001b")
A, B, C = 61, 62, 63
# A server on a port of the instance: answers every connection with one line, `port-<n>`.
SERVER = ("$p = shift; $s = IO::Socket::INET->new(LocalPort => $p, Listen => 64, ReuseAddr => 1)"
          " or die $!; $SIG{CHLD} = 'IGNORE'; while (1) { $c = $s->accept or next;"
          ' print $c "port-$p\\n"; close $c }')
# A client bound to a chosen source address (the namespace holds several): prints the
# line the server sent, or exits 1 when no connection came up in time.
CLIENT = ("import socket, sys\n"
          "source, host, port, seconds = sys.argv[1:]\n"
          "s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)\n"
          "s.settimeout(float(seconds))\n"
          "s.bind((source, 0))\n"
          "try:\n"
          "    s.connect((host, int(port)))\n"
          "    print(s.makefile().readline().strip())\n"
          "except OSError as exc:\n"
          "    sys.exit(f'{type(exc).__name__}: {exc}')\n")


class Sources:
    """The client side's addresses: the allowed ones and the others, IPv4 and IPv6."""

    def __init__(self, octet: str):
        # as a number: a digit 0 written before 7 made "203.0.113.07", which `ip` refuses
        self.allowed4, self.other4 = f"203.0.113.{int(octet) * 10 + 7}", f"203.0.113.{int(octet) * 10 + 8}"
        self.node6, self.client6 = f"fd5e:{octet}::1", f"fd5e:{octet}::2"
        self.allowed6, self.other6 = f"2001:db8:{octet}::7", f"2001:db8:{octet}::8"


class PortNode:
    def __init__(self, runtime_factory, netns, sources, disks, image):
        self.new_runtime = runtime_factory
        self.runtime = runtime_factory()
        self.netns, self.sources, self.disks, self.image = netns, sources, disks, image

    def spec(self, lease_id, ports) -> InstanceSpec:
        return InstanceSpec(lease_id=lease_id, image=self.image,
                            gpu_uuids=GPUS[lease_id - A:lease_id - A + 1], ssh_authorized_keys=(),
                            cpus=1, memory_gb=1, shm_gb=1,
                            disk_path=self.disks.ensure_ready(lease_id, 10),
                            ports=parse_ports(ports))

    def host_port(self, lease_id, port) -> int:
        """From the container's label, as `status` reports it, but without the runtime's
        filter sync that `status` does (a probe must not repair the table it probes)."""
        labels = self.runtime.client.api.inspect_container(f"lease-{lease_id}")["Config"]["Labels"]
        return json.loads(labels[LABEL_PUBLISHED])[str(port)]

    def serve(self, lease_id, *ports):
        """Start the server on these ports in the instance; wait until each answers."""
        container = self.runtime.client.containers.get(f"lease-{lease_id}")
        for port in ports:
            container.exec_run(["perl", "-MIO::Socket::INET", "-e", SERVER, str(port)],
                               detach=True)
            deadlines.wait_for(lambda port=port: self.inside(lease_id, "127.0.0.1", port)
                               == f"port-{port}", 10, f"the server on {lease_id}:{port}")

    def inside(self, lease_id, host, port) -> str:
        """The line a connection from the instance to host:port gets ("" for none)."""
        return self.inside_all(lease_id, [(host, port)])[f"{host}:{port}"]

    def inside_all(self, lease_id, targets) -> dict[str, str]:
        """`inside` for several (host, port) at once, in parallel: {"host:port": line}."""
        container = self.runtime.client.containers.get(f"lease-{lease_id}")
        seconds = f"{deadlines.scaled(2):.1f}"
        probes = " ".join(f"(echo \"{h}:{p} $(timeout {seconds} bash -c "
                          f"'exec 3<>/dev/tcp/{h}/{p}; head -n1 <&3' 2>/dev/null)\") &"
                          for h, p in targets)
        output = container.exec_run(["bash", "-c", f"{probes} wait"]).output.decode(errors="replace")
        found = dict((line.split(" ", 1) + [""])[:2] for line in output.splitlines() if line.strip())
        return {f"{h}:{p}": found.get(f"{h}:{p}", "").strip() for h, p in targets}

    def from_client(self, source, lease_id, port) -> str:
        """The line a connection from `source` (client side) to the lease's published
        port gets on the node's address; "" when it did not come up."""
        return self.from_client_all([(source, lease_id, port)])[source, lease_id, port]

    def from_client_all(self, probes) -> dict[tuple, str]:
        """`from_client` for several (source, lease, port) at once, in parallel (a dropped
        SYN costs the whole timeout)."""
        seconds = f"{deadlines.scaled(2):.1f}"
        running = {}
        for source, lease_id, port in probes:
            host = self.sources.node6 if ":" in source else self.netns.node_ip
            running[source, lease_id, port] = subprocess.Popen(self.netns.in_client(
                sys.executable, "-c", CLIENT, source, host, str(self.host_port(lease_id, port)),
                seconds), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return {probe: (out.strip() if process.returncode == 0 else "")
                for probe, process in running.items()
                for out in [process.communicate(timeout=deadlines.scaled(30))[0]]}

    def address(self, lease_id) -> tuple[str, str]:
        net = self.runtime.client.api.inspect_container(f"lease-{lease_id}")[
            "NetworkSettings"]["Networks"][f"lease-{lease_id}"]
        return net["IPAddress"], net["Gateway"]

    def container_id(self, lease_id) -> str:
        return self.runtime.client.containers.get(f"lease-{lease_id}").id


def a_ports(sources, *, allowed=None):
    allowed = allowed or [sources.allowed4, sources.allowed6]
    return [{"port": 8888, "allow": [*allowed, LEASE_POOL]},
            {"port": 8000, "allow": ["0.0.0.0/0", "::/0"]}]


B_PORTS = [{"port": 8000, "allow": ["0.0.0.0/0", "::/0"]}]


@pytest.fixture(scope="module")
def node(dockerd, netns, instance_image, node_tmp_root):
    require_tool("nft", "nftables")
    work = Path(tempfile.mkdtemp(prefix="ports-", dir=node_tmp_root))
    work.chmod(0o711)
    sources = Sources(netns.node_ip.split(".")[2][-1])
    veth = {ns: subprocess.run(["ip", "-n", ns, "-o", "link", "show", "type", "veth"],
                               capture_output=True, text=True, check=True
                               ).stdout.split(":")[1].strip().split("@")[0]
            for ns in (netns.node, netns.client)}
    steps = [
        ["ip", "-n", netns.client, "addr", "add", f"{sources.allowed4}/32", "dev", "lo"],
        ["ip", "-n", netns.client, "addr", "add", f"{sources.other4}/32", "dev", "lo"],
        ["ip", "-n", netns.node, "route", "add", f"{sources.allowed4}/32", "via", netns.client_ip],
        ["ip", "-n", netns.node, "route", "add", f"{sources.other4}/32", "via", netns.client_ip],
        ["ip", "-n", netns.node, "addr", "add", f"{sources.node6}/64", "dev", veth[netns.node], "nodad"],
        ["ip", "-n", netns.client, "addr", "add", f"{sources.client6}/64", "dev", veth[netns.client], "nodad"],
        ["ip", "-n", netns.client, "addr", "add", f"{sources.allowed6}/128", "dev", "lo"],
        ["ip", "-n", netns.client, "addr", "add", f"{sources.other6}/128", "dev", "lo"],
        ["ip", "-n", netns.node, "route", "add", f"{sources.allowed6}/128", "via", sources.client6],
        ["ip", "-n", netns.node, "route", "add", f"{sources.other6}/128", "via", sources.client6],
    ]
    for argv in steps:
        subprocess.run(argv, check=True, capture_output=True)
    config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                          gpu_devices=stand_in_devices(GPUS), port_range=(22850, 22899),
                          published_port_range=(23850, 23899), stop_timeout=2)
    node = PortNode(lambda state="runtime": DockerRuntime(config, work / state), netns, sources,
                    DirectoryDisks(work / "disks"), instance_image)
    try:
        node.runtime.ensure_running(node.spec(A, a_ports(sources)))
        node.runtime.ensure_running(node.spec(B, B_PORTS))
        node.serve(A, 8888, 8000)
        node.serve(B, 8000)
        yield node
    finally:
        for lease_id in node.runtime.lease_ids():
            node.runtime.ensure_absent(lease_id)
        for argv in reversed(steps):
            subprocess.run([*argv[:4], "del", *argv[5:]], capture_output=True)


def nft_in_node(netns, *args) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", netns.node, "nft", *args],
                          capture_output=True, text=True)


def reached_8888(node) -> dict[str, str]:
    s = node.sources
    return {source: line for (source, _, _), line in node.from_client_all(
        [(source, A, 8888) for source in (s.allowed4, s.other4, s.allowed6, s.other6)]).items()}


def assert_admitted_as_listed(node):
    s = node.sources
    probes = [(source, A, 8888) for source in (s.allowed4, s.other4, s.allowed6, s.other6)]
    # open to anyone: both families, any source
    probes += [(s.other4, A, 8000), (s.other6, A, 8000), (s.other4, B, 8000), (s.other6, B, 8000)]
    assert node.from_client_all(probes) == {
        (s.allowed4, A, 8888): "port-8888", (s.other4, A, 8888): "",
        (s.allowed6, A, 8888): "port-8888", (s.other6, A, 8888): "",
        (s.other4, A, 8000): "port-8000", (s.other6, A, 8000): "port-8000",
        (s.other4, B, 8000): "port-8000", (s.other6, B, 8000): "port-8000"}


def assert_tenants_never_reach_each_other(node):
    a_ip, a_gateway = node.address(A)
    b_ip, b_gateway = node.address(B)
    node_ip = node.netns.node_ip
    targets_from_b = [(host, node.host_port(A, port)) for port in (8888, 8000)
                      for host in (node_ip, b_gateway, a_gateway)] + [(a_ip, 8888), (a_ip, 8000)]
    # B's address is in 8888's list (the whole lease pool): still refused
    assert node.inside_all(B, targets_from_b) == {f"{h}:{p}": "" for h, p in targets_from_b}
    targets_from_a = [(node_ip, node.host_port(B, 8000)), (a_gateway, node.host_port(B, 8000)),
                      (b_ip, 8000), (node_ip, node.host_port(A, 8888))]
    assert node.inside_all(A, targets_from_a) == {f"{h}:{p}": "" for h, p in targets_from_a}
    # the probe itself works: each reaches its own server on its bridge address
    assert node.inside_all(A, [(a_ip, 8888)]) == {f"{a_ip}:8888": "port-8888"}
    assert node.inside_all(B, [(b_ip, 8000)]) == {f"{b_ip}:8000": "port-8000"}


def test_a_port_admits_its_listed_sources_only(node):
    assert_admitted_as_listed(node)
    assert node.runtime.status(A).ports == ((8000, 23850), (8888, 23851))
    assert node.runtime.status(B).ports == ((8000, 23852),)


def test_another_tenant_never_reaches_a_published_port(node):
    assert_tenants_never_reach_each_other(node)
    assert_admitted_as_listed(node)          # the client side meanwhile, as listed


def test_a_changed_list_rewrites_the_filter_without_recreating_the_instance(node):
    s = node.sources
    before = node.container_id(A)
    swapped = parse_ports(a_ports(s, allowed=[s.other4, s.other6]))
    node.runtime.allow_ports(A, swapped)
    assert node.container_id(A) == before
    assert reached_8888(node) == {s.allowed4: "", s.other4: "port-8888", s.allowed6: "",
                                  s.other6: "port-8888"}
    # a port left out of the lists admits nobody
    node.runtime.allow_ports(A, (PublishedPort(8000, ("0.0.0.0/0", "::/0")),))
    assert set(reached_8888(node).values()) == {""}
    node.runtime.allow_ports(A, parse_ports(a_ports(s)))
    assert_admitted_as_listed(node)
    assert node.container_id(A) == before


def test_the_port_rules_come_back_after_a_flush(node):
    netns, s = node.netns, node.sources
    assert nft_in_node(netns, "flush", "ruleset").returncode == 0
    # without the table the port is open to any source (what the rules are for)
    assert node.from_client(s.other4, A, 8888) == "port-8888"
    interval = AgentConfig().filter_guard_seconds
    guard = FilterGuard(node.runtime.filter, interval).start()
    try:
        deadlines.wait_for(
            lambda: nft_in_node(netns, "list", "table", "inet", TABLE).returncode == 0,
            3 * interval + 2, "the guard restoring the table", every=0.05)
    finally:
        guard.stop()
    listed = nft_in_node(netns, "list", "chain", "inet", TABLE, f"port_{node.host_port(A, 8888)}")
    assert listed.returncode == 0 and s.allowed4 in listed.stdout, listed.stderr
    assert_admitted_as_listed(node)
    assert_tenants_never_reach_each_other(node)
    # a restarted agent (or a reboot, no table) writes them before anything else
    assert nft_in_node(netns, "flush", "ruleset").returncode == 0
    node.runtime = node.new_runtime()
    assert_admitted_as_listed(node)


def test_host_ports_stay_across_restarts_added_ports_and_a_lost_book(node):
    s = node.sources
    published = node.runtime.status(A).ports
    node.runtime.ensure_stopped(A)
    node.runtime.ensure_running(node.spec(A, a_ports(s)))
    assert node.runtime.status(A).ports == published
    before = node.container_id(A)
    # a port added: a new container (the spec changed), the others where they were
    added = [*a_ports(s), {"port": 6006, "allow": [s.allowed4]}]
    node.runtime.ensure_running(node.spec(A, added))
    assert node.container_id(A) != before
    ports = dict(node.runtime.status(A).ports)
    assert {8000: ports[8000], 8888: ports[8888]} == dict(published)
    taken = {*published, *node.runtime.status(B).ports}
    assert ports[6006] not in {host for _, host in taken}
    node.serve(A, 8888, 8000, 6006)
    assert node.from_client_all([(s.allowed4, A, 6006), (s.allowed6, A, 6006)]) == {
        (s.allowed4, A, 6006): "port-6006", (s.allowed6, A, 6006): ""}   # IPv4 only, as listed
    assert_admitted_as_listed(node)
    # The state directory lost (a new agent over a fresh one): the ports it does not know
    # the lists of are closed, and a new lease never gets a port an instance publishes.
    lost = node.new_runtime("runtime-lost")
    assert node.from_client(s.allowed4, A, 8888) == ""
    try:
        lost.ensure_running(node.spec(C, [{"port": 8888, "allow": ["0.0.0.0/0"]}]))
        [(_, host)] = lost.status(C).ports
        everyone = {h for lease in (A, B) for _, h in node.runtime.status(lease).ports}
        assert host not in everyone and 23850 <= host <= 23899
    finally:
        lost.ensure_absent(C)
    assert node.runtime.filter.restore()         # the first agent's table again
    assert_admitted_as_listed(node)
