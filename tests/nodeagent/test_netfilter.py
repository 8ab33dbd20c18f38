"""The node's packet filter (nodeagent/netfilter.py) on its own, without Docker: the table
it generates, and what a node holding it routes, in namespaces of the tests' own — a node
with a public side, a management network and one lease bridge `gl7` (a veth into a
"lease" namespace standing in for the instance). The node forwards a lease's own egress
and its replies and nothing else; FilterGuard puts a flushed table back within its
interval, counters continuing; install-node.sh's boot table holds the same drop.

The same with the real dockerd and two tenants: test_isolation.py."""
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.config import AgentConfig, ConfigError, parse_config
from nodeagent.netfilter import TABLE, FilterGuard, LeaseRule, PacketFilter
from tests import deadlines
from tests.tools import require_tool

from .netprobe import Sink, tcp_open, udp_arrives, udp_dropped

ROOT = Path(__file__).resolve().parents[2]
LEASE = LeaseRule(lease_id=7, ssh_port=22007)
NODE_PUBLIC, PUBLIC = "198.51.100.1", "198.51.100.2"      # not in the default blocked ranges
NODE_MGMT, MGMT = "10.77.0.1", "10.77.0.2"                 # RFC 1918: blocked for leases
GATEWAY, INSTANCE = "10.213.250.1", "10.213.250.2"


def forward_chain(ruleset: str) -> list[str]:
    """The forward chain's lines (its hook line first)."""
    body = re.search(r"chain forward \{\n(.*?)\n  \}", ruleset, re.S).group(1)
    return [line.strip() for line in body.splitlines()]


def test_the_forward_chain_accepts_only_lease_egress_and_its_replies():
    require_tool("nft", "nftables")
    packet_filter = PacketFilter(blocked_networks=())
    for leases in ((), (LEASE,)):
        chain = forward_chain(packet_filter.ruleset(leases))
        assert chain[0].endswith("policy drop;")
        assert [line for line in chain if line.endswith("accept")] == [
            'oifname "gl*" ct state established,related accept',          # replies in
            'iifname "gl*" counter name iifname map @egress_if accept',   # a metered lease out
        ]
        # the blocked destinations are dropped before the lease's accept
        blocked = chain.index('iifname "gl*" ip daddr @blocked4 counter drop')
        assert blocked < chain.index('iifname "gl*" counter name iifname map @egress_if accept')
    # a restored table's counters start where they were
    assert "counter egress_7 { packets 0 bytes 5000 }" in packet_filter.ruleset(
        (LEASE,), counters={7: 5000})


def test_the_guard_interval_is_a_setting():
    assert AgentConfig().filter_guard_seconds == 1.0
    assert parse_config({"filter_guard_seconds": 0.5}).filter_guard_seconds == 0.5
    for bad in (0, -1, 61, "1", True):
        with pytest.raises(ConfigError, match="filter_guard_seconds"):
            parse_config({"filter_guard_seconds": bad})


@dataclass
class Node:
    node: str
    public: str
    mgmt: str
    lease: str
    holder: subprocess.Popen            # a process in `node`: the filter's netns_pid
    work: Path

    def new_filter(self) -> PacketFilter:
        return PacketFilter(blocked_networks=("10.0.0.0/8",), netns_pid=self.holder.pid)

    def nft(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.node, "nft", *args],
                              capture_output=True, text=True)

    def has_table(self) -> bool:
        return self.nft("list", "table", "inet", TABLE).returncode == 0


@pytest.fixture(scope="module")
def node():
    require_tool("ip", "iproute2")
    require_tool("nft", "nftables")
    require_tool("nsenter", "util-linux")
    suffix = secrets.token_hex(3)
    names = {role: f"gnf-{role}-{suffix}" for role in ("node", "public", "mgmt", "lease")}
    n, p, m, lease = names["node"], names["public"], names["mgmt"], names["lease"]
    steps = [["ip", "netns", "add", ns] for ns in names.values()]
    steps += [["ip", "link", "add", f"n{end}{suffix}", "netns", n, "type", "veth",
               "peer", "name", f"{end}n{suffix}", "netns", other]
              for end, other in (("p", p), ("m", m), ("l", lease))]
    steps += [
        ["ip", "-n", n, "link", "add", "gl7", "type", "bridge"],
        ["ip", "-n", n, "link", "set", f"nl{suffix}", "master", "gl7"],
        ["ip", "-n", n, "addr", "add", f"{NODE_PUBLIC}/30", "dev", f"np{suffix}"],
        ["ip", "-n", n, "addr", "add", f"{NODE_MGMT}/30", "dev", f"nm{suffix}"],
        ["ip", "-n", n, "addr", "add", f"{GATEWAY}/28", "dev", "gl7"],
        ["ip", "-n", p, "addr", "add", f"{PUBLIC}/30", "dev", f"pn{suffix}"],
        ["ip", "-n", m, "addr", "add", f"{MGMT}/30", "dev", f"mn{suffix}"],
        ["ip", "-n", lease, "addr", "add", f"{INSTANCE}/28", "dev", f"ln{suffix}"],
    ]
    for ns, links in ((n, (f"np{suffix}", f"nm{suffix}", f"nl{suffix}", "gl7")),
                      (p, (f"pn{suffix}",)), (m, (f"mn{suffix}",)), (lease, (f"ln{suffix}",))):
        steps += [["ip", "-n", ns, "link", "set", link, "up"] for link in ("lo", *links)]
    steps += [
        # the public side knows a way to the management network and to the lease's
        # addresses: through the node (an attacker on the node's segment can add these)
        ["ip", "-n", p, "route", "add", "10.77.0.0/30", "via", NODE_PUBLIC],
        ["ip", "-n", p, "route", "add", "10.213.250.0/28", "via", NODE_PUBLIC],
        ["ip", "-n", m, "route", "add", "default", "via", NODE_MGMT],
        ["ip", "-n", lease, "route", "add", "default", "via", GATEWAY],
        # what dockerd does on a node, "iptables": false or not
        ["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
    ]
    holder, work = None, Path(tempfile.mkdtemp(prefix="netfilter-"))
    try:
        for argv in steps:
            subprocess.run(argv, check=True, capture_output=True)
        holder = subprocess.Popen(["ip", "netns", "exec", n, "sleep", "infinity"])
        yield Node(n, p, m, lease, holder, work)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def sinks(node):
    """TCP and UDP listeners on the public host and the management host."""
    started = {(where, udp): Sink(getattr(node, where), node.work, udp=udp)
               for where in ("public", "mgmt") for udp in (False, True)}
    yield started
    for sink in started.values():
        sink.stop()


def test_the_node_forwards_a_leases_egress_and_replies_and_nothing_else(node, sinks):
    node.nft("delete", "table", "inet", TABLE)
    mgmt_tcp, mgmt_udp = sinks["mgmt", False], sinks["mgmt", True]
    public_tcp, public_udp = sinks["public", False], sinks["public", True]
    # without the table the node routes between its networks (what is guarded against)
    assert tcp_open(node.public, MGMT, mgmt_tcp.port)
    assert udp_arrives(mgmt_udp, node.public, MGMT, mgmt_udp.port)

    packet_filter = node.new_filter()
    packet_filter.ensure([LEASE])
    assert_a_wall(node, sinks)
    # the lease's own egress still leaves, metered, and its replies come back in
    sent = subprocess.run(["ip", "netns", "exec", node.lease, "timeout", "10", "bash", "-c",
                           f"head -c 100000 /dev/zero > /dev/tcp/{PUBLIC}/{public_tcp.port}"])
    assert sent.returncode == 0
    deadlines.wait_for(lambda: "100000" in public_tcp.lines(), 10, "the lease's 100 kB")
    assert packet_filter.egress_bytes()[7] > 100000
    assert udp_arrives(public_udp, node.lease, PUBLIC, public_udp.port)
    # ... but not to the management network (blocked_networks), nor does anything open a
    # connection into the lease bridge from outside
    assert not tcp_open(node.lease, MGMT, mgmt_tcp.port)
    assert not tcp_open(node.public, INSTANCE, 22)


def assert_a_wall(node, sinks):
    """Public to management and back, TCP and UDP: nothing crosses the node."""
    mgmt_tcp, mgmt_udp = sinks["mgmt", False], sinks["mgmt", True]
    public_tcp, public_udp = sinks["public", False], sinks["public", True]
    accepted = len(mgmt_tcp.lines()), len(public_tcp.lines())
    assert not tcp_open(node.public, MGMT, mgmt_tcp.port)
    assert udp_dropped(mgmt_udp, node.public, MGMT, mgmt_udp.port, node_netns=node.node)
    assert not tcp_open(node.mgmt, PUBLIC, public_tcp.port)
    assert udp_dropped(public_udp, node.mgmt, PUBLIC, public_udp.port, node_netns=node.node)
    assert (len(mgmt_tcp.lines()), len(public_tcp.lines())) == accepted   # no connection


def test_the_guard_restores_a_flushed_table_within_its_interval(node, sinks):
    packet_filter = node.new_filter()
    packet_filter.ensure([LEASE])
    public_tcp = sinks["public", False]
    subprocess.run(["ip", "netns", "exec", node.lease, "timeout", "10", "bash", "-c",
                    f"head -c 50000 /dev/zero > /dev/tcp/{PUBLIC}/{public_tcp.port}"], check=True)
    counted = packet_filter.egress_bytes()[7]
    interval = AgentConfig().filter_guard_seconds
    guard = FilterGuard(packet_filter, interval).start()
    try:
        assert node.nft("flush", "ruleset").returncode == 0
        flushed = time.monotonic()
        deadlines.wait_for(node.has_table, 3 * interval + 2, "the table restored", every=0.02)
        window = time.monotonic() - flushed
        print(f"filter window after flush (guard every {interval:g} s): {window:.2f} s")
        assert window <= deadlines.scaled(3 * interval + 1)
        assert packet_filter.restored == 1
        # the same lease set, its counter continuing where it was
        assert packet_filter.egress_bytes()[7] >= counted
        assert_a_wall(node, sinks)
        assert tcp_open(node.lease, PUBLIC, public_tcp.port)
    finally:
        stopped = time.monotonic()
        guard.stop()
    assert time.monotonic() - stopped <= deadlines.scaled(interval + 1)
    assert not guard.is_alive()


def test_the_install_scripts_boot_table_drops_forwarding(node, sinks, tmp_path):
    """What install-node.sh writes for nftables.service before the agent ever ran."""
    boot = tmp_path / "nftables.nft"
    made = subprocess.run([sys.executable, "-m", "nodeagent", "--config",
                           str(ROOT / "nodeagent" / "config.example.toml"), "boot-filter",
                           "--write", str(boot)],
                          cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert node.nft("flush", "ruleset").returncode == 0
    loaded = node.nft("-f", str(boot))
    assert loaded.returncode == 0, loaded.stderr
    assert forward_chain(boot.read_text())[0].endswith("policy drop;")
    assert_a_wall(node, sinks)
    assert not tcp_open(node.lease, PUBLIC, sinks["public", False].port)   # no lease known yet
    # the agent takes over from it
    node.new_filter().ensure([LEASE])
    assert tcp_open(node.lease, PUBLIC, sinks["public", False].port)
