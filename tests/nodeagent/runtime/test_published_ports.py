"""Customers' published ports on the agent's side, without Docker: the desired item's
`ports` checked and normalised, the host port book (stable per lease and container port, a
range of its own, never a port another instance publishes), the allow lists kept beside
the containers, the node's limits in the config, and the packet filter's text for them —
every generated table parses with `nft -c -f`, and each port admits exactly the networks
asked. The same with the real dockerd and nft: test_port_isolation.py; through the
converger and its report: test_converge.py."""
import ipaddress
import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.config import ConfigError, DockerConfig, parse_config
from nodeagent.interfaces import OperationFailed, PublishedPort
from nodeagent.netfilter import LeaseRule, PacketFilter, PortRule
from nodeagent.runtime.ports import AllowBook, PublishedPortBook, parse_ports
from tests.tools import require_tool


# -- the desired item's `ports` ---------------------------------------------------------------
def test_ports_are_normalised_sorted_and_collapsed_per_family():
    parsed = parse_ports([
        {"port": 8888, "allow": ["203.0.113.9/24", "2001:db8::1/32", " 198.51.100.7 ",
                                 "203.0.113.128/25"]},
        {"port": 6006, "allow": []},
        {"port": 80, "allow": ["0.0.0.0/0", "::/0"]},
    ])
    assert parsed == (
        PublishedPort(80, ("0.0.0.0/0", "::/0")),
        PublishedPort(6006, ()),                                   # open to nobody
        PublishedPort(8888, ("198.51.100.7/32", "203.0.113.0/24", "2001:db8::/32")),
    )
    assert parse_ports(None) == () and parse_ports([]) == ()


@pytest.mark.parametrize("raw, message", [
    ("8888", "ports must be a list"),
    ([8888], r"ports\[0\] must be an object"),
    ([{"port": 8888, "allow": [], "proto": "udp"}], r"ports\[0\] must be an object"),
    ([{"port": 0, "allow": []}], r"ports\[0\].port must be a TCP port 1-65535"),
    ([{"port": 65536, "allow": []}], "must be a TCP port"),
    ([{"port": True, "allow": []}], "must be a TCP port"),
    ([{"port": "8888", "allow": []}], "must be a TCP port"),
    ([{"port": 22, "allow": []}], "is the instance's sshd"),
    ([{"port": 80, "allow": []}, {"port": 80, "allow": []}], r"ports\[1\].port 80 is listed twice"),
    ([{"port": 80, "allow": "0.0.0.0/0"}], "allow must be a list"),
    ([{"port": 80, "allow": ["0.0.0.0/0"]}, {"port": 81, "allow": ["10.0.0.0/33"]}],
     r"ports\[1\].allow: '10.0.0.0/33' is not an IPv4 or IPv6 network"),
    ([{"port": 80, "allow": ["example.org"]}], "'example.org' is not an IPv4 or IPv6 network"),
    ([{"port": 80, "allow": [7]}], "7 is not an IPv4 or IPv6 network"),
])
def test_a_bad_ports_list_is_refused_naming_the_entry(raw, message):
    with pytest.raises(OperationFailed, match=message) as refused:
        parse_ports(raw)
    assert refused.value.code == "bad_ports"


def test_more_ports_than_the_node_publishes_are_refused():
    three = [{"port": p, "allow": []} for p in (80, 81, 82)]
    assert len(parse_ports(three, limit=3)) == 3
    with pytest.raises(OperationFailed, match="3 published ports asked; this node publishes at most 2"):
        parse_ports(three, limit=2)


# -- the host port book -----------------------------------------------------------------------
def test_host_ports_are_stable_per_lease_and_container_port(tmp_path):
    book = PublishedPortBook(tmp_path / "published.json", (23000, 23009))
    # another instance publishes 23000 and 23001 (its labels), though the book never saw it
    taken = frozenset({23000, 23001})
    first = book.ports_for(5, [8888, 6006], taken=taken)
    assert first == {6006: 23002, 8888: 23003}
    assert book.ports_for(5, [6006, 8888], taken=taken) == first           # a restart
    assert book.ports_for(6, [8888], taken=taken) == {8888: 23004}          # another lease
    # a port added keeps the others where they were; one removed is released ...
    assert book.ports_for(5, [8888, 80], taken=taken) == {8888: 23003, 80: 23002}
    assert book.ports_for(5, [8888], taken=taken) == {8888: 23003}
    assert book.ports_for(7, [1], taken=taken) == {1: 23002}                # ... for others
    book.release(5)
    assert book.ports_for(8, [1, 2], taken=taken) == {1: 23003, 2: 23005}
    assert book.ports_for(5, [], taken=taken) == {}


def test_a_full_range_is_a_named_failure(tmp_path):
    book = PublishedPortBook(tmp_path / "published.json", (23000, 23001))
    assert book.ports_for(1, [80], taken=frozenset({23000})) == {80: 23001}
    with pytest.raises(OperationFailed) as full:
        book.ports_for(2, [80], taken=frozenset({23000}))
    assert full.value.code == "no_free_port" and "23000-23001" in full.value.detail


def test_allow_lists_are_kept_per_lease_and_report_a_change(tmp_path):
    allows = AllowBook(tmp_path / "allow.json")
    assert allows.get(5) == {}
    ports = (PublishedPort(8888, ("203.0.113.0/24",)), PublishedPort(6006, ()))
    assert allows.set(5, ports) is True
    assert allows.set(5, ports) is False                   # unchanged: no filter rewrite
    assert allows.get(5) == {8888: ("203.0.113.0/24",), 6006: ()}
    assert allows.set(5, (PublishedPort(8888, ("::/0",)),)) is True
    allows.forget(5)
    assert allows.get(5) == {}


# -- the node's configuration -----------------------------------------------------------------
def test_the_published_range_and_count_are_settings_apart_from_ssh():
    assert (DockerConfig().published_port_range, DockerConfig().max_published_ports) == ((23000, 23999), 8)
    parsed = parse_config({"docker": {"published_port_range": [30000, 30099], "max_published_ports": 3}})
    assert (parsed.docker.published_port_range, parsed.docker.max_published_ports) == ((30000, 30099), 3)
    with pytest.raises(ConfigError, match="overlaps docker.port_range"):
        parse_config({"docker": {"published_port_range": [22900, 23100]}})
    with pytest.raises(ConfigError, match="overlaps docker.port_range"):
        parse_config({"docker": {"port_range": [23500, 23600], "published_port_range": [23000, 23999]}})
    # an older configuration with its ssh range only: the published range follows it
    assert parse_config({"docker": {"port_range": [23000, 23010]}}).docker.published_port_range == (23011, 24010)
    assert parse_config({"docker": {"port_range": [65000, 65535]}}).docker.published_port_range == (64000, 64999)
    with pytest.raises(ConfigError, match="is not a port range"):
        parse_config({"docker": {"published_port_range": [30000, 70000]}})
    with pytest.raises(ConfigError, match="max_published_ports"):
        parse_config({"docker": {"max_published_ports": 100}})


# -- the packet filter's text -----------------------------------------------------------------
def chain(ruleset: str, name: str) -> list[str]:
    body = re.search(rf"  chain {name} \{{\n(.*?)\n  \}}", ruleset, re.S)
    return [line.strip() for line in body.group(1).splitlines()] if body else []


def allowed_networks(ruleset: str, host_port: int) -> set:
    """The source networks the port's chain accepts (what nft will hold)."""
    found = set()
    for line in chain(ruleset, f"port_{host_port}"):
        match = re.fullmatch(r"ip6? saddr \{ (.*) \} accept", line)
        if match:
            found |= {ipaddress.ip_network(n) for n in match.group(1).split(", ")}
    return found


def test_a_published_port_admits_its_networks_and_drops_the_rest():
    packet_filter = PacketFilter(blocked_networks=())
    lease = LeaseRule(41, 22041, (PortRule(23000, 8888, ("203.0.113.0/24", "2001:db8::/32")),
                                  PortRule(23001, 6006, ())))
    ruleset = packet_filter.ruleset([lease, LeaseRule(42, 22042)])
    assert chain(ruleset, "port_23000") == [
        "ip saddr { 203.0.113.0/24 } accept",
        "ip6 saddr { 2001:db8::/32 } accept",
        'counter drop comment "lease 41 port 8888: source not allowed"',
    ]
    assert chain(ruleset, "port_23001") == ['counter drop comment "lease 41 port 6006: source not allowed"']
    inputs = chain(ruleset, "input")
    # a lease bridge's packets are dropped before the dispatch: no tenant reaches a port,
    # whatever its allow list holds
    assert inputs[1:] == [
        'iifname "gl*" ct state established,related accept',
        'iifname "gl*" counter drop',
        "tcp dport vmap { 23000 : jump port_23000, 23001 : jump port_23001 }",
    ]
    # the ssh ports have no chain: open to all, as before
    assert "port_22041" not in ruleset and "port_22042" not in ruleset
    # what leaves the node from a published port is the lease's egress, like ssh's
    assert '23000 : "egress_41", 23001 : "egress_41"' in ruleset
    # no published port, no dispatch: the table of a node without them is unchanged
    assert "vmap" not in packet_filter.ruleset([LeaseRule(42, 22042)])


networks4 = st.builds(lambda a, p: ipaddress.IPv4Network((a, p), strict=False),
                      st.integers(0, 2**32 - 1), st.integers(0, 32))
networks6 = st.builds(lambda a, p: ipaddress.IPv6Network((a, p), strict=False),
                      st.integers(0, 2**128 - 1), st.integers(0, 128))
allow_lists = st.lists(st.one_of(networks4, networks6), max_size=6)
lease_sets = st.lists(st.tuples(st.integers(1, 10**6), st.lists(allow_lists, max_size=4)),
                      max_size=4, unique_by=lambda lease: lease[0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lease_sets)
def test_generated_tables_parse_and_admit_exactly_what_was_asked(leases):
    nft = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
    rules, asked, host_port = [], {}, 23000
    for index, (lease_id, port_lists) in enumerate(leases):
        ports = []
        for offset, allow in enumerate(port_lists):
            # the converger's normalised form (parse_ports), from the raw strings
            [parsed] = parse_ports([{"port": 1000 + offset, "allow": [str(n) for n in allow]}])
            ports.append(PortRule(host_port, 1000 + offset, parsed.allow))
            asked[host_port] = allow
            host_port += 1
        rules.append(LeaseRule(lease_id, 22000 + index, tuple(ports)))
    ruleset = PacketFilter(blocked_networks=()).ruleset(rules)
    for port, allow in asked.items():
        held = allowed_networks(ruleset, port)
        # exactly the asked addresses: same collapsed networks per family
        for version in (4, 6):
            assert sorted(n for n in held if n.version == version) == list(
                ipaddress.collapse_addresses(n for n in allow if n.version == version))
        assert chain(ruleset, f"port_{port}")[-1].startswith("counter drop")
        assert f"{port} : jump port_{port}" in ruleset
    if nft:
        check = subprocess.run([nft, "-c", "-f", "-"], input=ruleset, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    else:
        require_tool("nft", "nftables")
