"""The node's packet filter for lease instances (nftables, one table the agent owns).

Every lease's instance sits alone on its own bridge, named `gl<lease id>`. The table
`inet gpu_node_agent` lets an instance reach the internet and nothing else on the node:

- input from a lease bridge: only replies (the userland proxy's connection to the
  instance's sshd); new connections to the gateway, the node's addresses, its services
  and other leases' published ports are dropped;
- input to a customer's published port (`PortRule`: a host port of its own range the
  userland proxy listens on): a chain per port accepts its allowed source networks and
  drops everything else, every packet (a narrowed list cuts open connections too). It
  comes after the lease-bridge drop, so no tenant gets there, listed or not. The ssh
  ports have no such chain: open to all;
- forward from a lease bridge: never into another lease bridge, never to the blocked
  networks (link-local/metadata always, plus the management and private ranges of
  `blocked_networks`); the rest leaves the node, masqueraded;
- forward into a lease bridge: only replies (nothing from outside opens a connection to
  an instance; its ssh port is published by the proxy on the node);
- everything else the node would route (public side to management network and back,
  anything not a lease's own egress or its reply) is dropped by the forward chain's
  `policy drop`: dockerd turns on ip_forward even with `"iptables": false`, and a node is a
  wall, not a router. The published ssh ports are unaffected: the userland proxy is a
  local process (input and output, never forward);
- egress metering: one named counter per lease, fed by the forward path out of the node
  and by the proxy's packets leaving the node from the lease's published ports (ssh's and
  the customer's). Bytes to
  neighbours or the node are never counted (they are dropped before the counter).

The table is replaced atomically (one `nft -f` transaction) whenever the set of leases
changes or what the kernel holds no longer matches what the agent wrote (a hand-made
`nft flush ruleset`, a reboot, a restarted firewall); checking costs one `nft -j list`.
`FilterGuard` checks on a timer of its own (`filter_guard_seconds`), with nft only and the
last lease set written, so a lost table comes back within a second whatever the agent's
round is doing (backing off through a storefront outage, pulling an image). The same
table with no lease is what `nodeagent/install-node.sh` installs for boot
(`python -m nodeagent.netfilter`), so the drop holds before the agent ever ran.
The rules are written in the network namespace of dockerd (the peer of its socket), so a
daemon running in another namespace (the tests') gets them where its bridges are.
"""
import ipaddress
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .interfaces import OperationFailed
from .state import write_atomic

log = logging.getLogger(__name__)

TABLE = "gpu_node_agent"
BRIDGE_PREFIX = "gl"
# Never reachable from an instance, whatever the configuration says.
ALWAYS_BLOCKED = ("169.254.0.0/16", "fe80::/10")
# The default for `blocked_networks`: private, shared and unique-local ranges (a node's
# management network and its neighbours live there), multicast and reserved space.
DEFAULT_BLOCKED = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                   "127.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "fc00::/7", "ff00::/8")
CHECK_INTERVAL_SECONDS = 1.0


def bridge_name(lease_id: int) -> str:
    return f"{BRIDGE_PREFIX}{lease_id}"


@dataclass(frozen=True)
class PortRule:
    """A customer's published port: new connections to `host_port` only from `allow`
    (CIDRs, IPv4 and IPv6; empty: from nowhere)."""
    host_port: int
    container_port: int
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class LeaseRule:
    lease_id: int
    ssh_port: int
    ports: tuple[PortRule, ...] = ()     # its published ports (the ssh port is open to all)


class PacketFilter:
    def __init__(self, *, blocked_networks, masquerade: bool = True,
                 netns_pid: int | None = None, saved_path: Path | None = None):
        self.blocked = _split_families([*ALWAYS_BLOCKED, *blocked_networks])
        self.saved_path = saved_path
        self.masquerade = masquerade
        self.netns_pid = netns_pid
        self.nft = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
        if not self.nft:
            raise OperationFailed("runtime_error", "nft (package nftables) is not installed: "
                                  "instances cannot be isolated")
        self._written: tuple[str, frozenset] | None = None   # (fingerprint, leases)
        self._checked_at = 0.0
        self.restored = 0                                      # times a lost table was rewritten
        # The agent's round and FilterGuard's thread both write the table: one at a time.
        self._lock = threading.RLock()
        # Each lease counter's bytes as last listed: a table restored after a flush starts
        # its counters there, so they never go backwards under the egress meter.
        self._seen_bytes: dict[int, int] = {}

    # -- the one entry point -------------------------------------------------------------
    def ensure(self, leases: list[LeaseRule], *, force_check: bool = False) -> dict[int, int]:
        """Make the kernel hold the table for exactly these leases. Returns, for leases
        whose counters were recreated (0 bytes from now on), their byte count before
        (None when the old table was lost)."""
        with self._lock:
            return self._ensure(frozenset(leases), force_check)

    def _ensure(self, wanted: frozenset, force_check: bool) -> dict[int, int]:
        now = time.monotonic()
        if (self._written and self._written[1] == wanted and not force_check
                and now - self._checked_at < CHECK_INTERVAL_SECONDS):
            return {}
        self._checked_at = now
        current = self._list()
        if self._written and self._written[1] == wanted and current is not None \
                and _fingerprint(current) == self._written[0]:
            return {}
        if self._written and (current is None or _fingerprint(current) != self._written[0]):
            self.restored += 1
            log.warning("packet filter: table inet %s was %s; restoring it", TABLE,
                        "missing" if current is None else "changed")
        before = _counter_bytes(current) if current is not None else {}
        self._apply(wanted)
        after = self._list()
        if after is None:
            raise OperationFailed("runtime_error", "packet filter: table vanished after writing")
        self._written = (_fingerprint(after), wanted)
        return {rule.lease_id: before.get(rule.lease_id) for rule in wanted}

    def restore(self) -> bool:
        """FilterGuard's check: rewrite the table last written (same leases) if the kernel
        lost or changed it. Needs only nft, never Docker (whose client is not thread-safe).
        The lease counters continue from their last value. True when it rewrote."""
        with self._lock:
            if self._written is None:       # nothing written yet: the runtime writes it first
                return False
            current = self._list()
            if current is not None and _fingerprint(current) == self._written[0]:
                return False
            self.restored += 1
            log.warning("packet filter: table inet %s was %s; restoring it", TABLE,
                        "missing" if current is None else "changed")
            leases = self._written[1]
            self._apply(leases, counters=self._seen_bytes, save=False)
            after = self._list()
            if after is None:
                raise OperationFailed("runtime_error",
                                      "packet filter: table vanished after writing")
            self._written = (_fingerprint(after), leases)
            return True

    def egress_bytes(self) -> dict[int, int]:
        """Bytes each lease sent out of the node since its counter was created."""
        with self._lock:
            current = self._list()
            return _counter_bytes(current) if current is not None else {}

    # -- nft -----------------------------------------------------------------------------
    def _apply(self, leases: frozenset, *, counters: dict[int, int] | None = None,
               save: bool = True) -> None:
        script = (f"table inet {TABLE}\ndelete table inet {TABLE}\n"
                  + self.ruleset(leases, counters=counters))
        self._run(["-f", "-"], input=script)
        if save and self.saved_path:     # for nftables.service at boot (nodeagent/README.md)
            # always with counters at zero: the agent folds what the boot table counted
            # into its totals once it starts
            write_atomic(self.saved_path, self._boot_script(leases).encode(), mode=0o644)
        self._seen_bytes = {r.lease_id: (counters or {}).get(r.lease_id, 0) for r in leases}

    def _boot_script(self, leases) -> str:
        return f"table inet {TABLE}\ndelete table inet {TABLE}\n" + self.ruleset(leases)

    def ruleset(self, leases, *, counters: dict[int, int] | None = None) -> str:
        """The table for these leases; `counters`: bytes each lease's counter starts at."""
        ordered = sorted(leases, key=lambda r: r.lease_id)
        start = counters or {}
        declared = "".join(
            f"  counter egress_{r.lease_id} {{ packets 0 bytes {int(start[r.lease_id])} }}\n"
            if start.get(r.lease_id) else f"  counter egress_{r.lease_id} {{}}\n"
            for r in ordered)
        by_iface = ", ".join(f'"{bridge_name(r.lease_id)}" : "egress_{r.lease_id}"'
                             for r in ordered)
        # a published port's downloads leave through the proxy like ssh's: the lease's egress
        by_port = ", ".join(f'{port} : "egress_{r.lease_id}"' for r in ordered
                            for port in (r.ssh_port, *(p.host_port for p in r.ports)))
        published = sorted(((p, r.lease_id) for r in ordered for p in r.ports),
                           key=lambda pair: pair[0].host_port)
        dispatch = (f"    tcp dport vmap {{ {', '.join(f'{p.host_port} : jump port_{p.host_port}' for p, _ in published)} }}\n"
                    if published else "")
        port_chains = "".join(_port_chain(p, lease_id) for p, lease_id in published)
        lease_if = f'"{BRIDGE_PREFIX}*"'
        nat = (f"""  chain postrouting {{
    type nat hook postrouting priority srcnat - 10; policy accept;
    iifname {lease_if} oifname != {lease_if} masquerade
  }}
""" if self.masquerade else "")
        return f"""table inet {TABLE} {{
{declared}  map egress_if {{ type ifname : counter; {_elements(by_iface)}}}
  map egress_port {{ type inet_service : counter; {_elements(by_port)}}}
  set blocked4 {{ type ipv4_addr; flags interval; {_elements(', '.join(self.blocked[4]))}}}
  set blocked6 {{ type ipv6_addr; flags interval; {_elements(', '.join(self.blocked[6]))}}}
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    iifname {lease_if} ct state established,related accept
    iifname {lease_if} counter drop
{dispatch}  }}
{port_chains}  chain forward {{
    type filter hook forward priority filter - 10; policy drop;
    oifname {lease_if} ct state established,related accept
    oifname {lease_if} counter drop
    iifname {lease_if} ip daddr @blocked4 counter drop
    iifname {lease_if} ip6 daddr @blocked6 counter drop
    iifname {lease_if} counter name iifname map @egress_if accept
    counter comment "routed, not a lease's egress or its reply: dropped"
  }}
  chain output {{
    type filter hook output priority filter - 10; policy accept;
    oifname != "lo" oifname != {lease_if} counter name tcp sport map @egress_port
  }}
{nat}}}
"""

    def _list(self):
        result = self._run(["-j", "list", "table", "inet", TABLE], check=False)
        if result.returncode != 0:
            return None
        objects = json.loads(result.stdout)["nftables"]
        self._seen_bytes.update(_counter_bytes(objects))
        return objects

    def _run(self, args, *, input=None, check=True):
        argv = [self.nft, *args]
        if self.netns_pid and not _same_netns(self.netns_pid):
            argv = ["nsenter", "-t", str(self.netns_pid), "-n", *argv]
        result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise OperationFailed("runtime_error", f"nft {' '.join(args)}: "
                                  f"{result.stderr.strip()[-500:]}")
        return result


class FilterGuard:
    """Checks the table every `interval` seconds in a thread of its own and restores it
    (`PacketFilter.restore`). The agent's round also syncs the table, but rounds can be
    minutes apart (the storefront back-off): isolation must not wait for them."""

    def __init__(self, packet_filter: PacketFilter, interval: float):
        self.filter = packet_filter
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="filter-guard", daemon=True)
        self._last_error = ""

    def start(self) -> "FilterGuard":
        self._thread.start()
        return self

    def stop(self, timeout: float = 35.0) -> None:
        """Stop and wait for a check in progress (nft is bounded by its own timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.filter.restore()
            except Exception as exc:    # keep guarding; log a failure once, not every second
                if str(exc) != self._last_error:
                    log.error("isolation: packet filter guard: %s", exc)
                self._last_error = str(exc)
            else:
                self._last_error = ""


def socket_peer_pid(unix_url: str) -> int | None:
    """The pid of the process serving a unix socket (dockerd), for its network namespace."""
    if not unix_url.startswith("unix://"):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(unix_url[len("unix://"):])
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def validate_networks(networks) -> list[str]:
    """CIDR strings, normalised; raises ValueError on a bad one."""
    return [str(ipaddress.ip_network(n, strict=False)) for n in networks]


def _same_netns(pid: int) -> bool:
    return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino


def _split_families(networks) -> dict[int, list[str]]:
    parsed = [ipaddress.ip_network(n) for n in networks]
    return {version: [str(n) for n in ipaddress.collapse_addresses(
        p for p in parsed if p.version == version)] for version in (4, 6)}


def _port_chain(rule: PortRule, lease_id: int) -> str:
    """Packets to a published port from its allowed sources only. Every packet, not just a
    new connection's first: narrowing the list cuts connections already open too. A lease
    bridge's packets never get here (the input chain dropped them before the dispatch), so
    another tenant is refused whatever the list holds."""
    allowed = _split_families(rule.allow)
    lines = [f"    {family} saddr {{ {', '.join(allowed[version])} }} accept\n"
             for version, family in ((4, "ip"), (6, "ip6")) if allowed[version]]
    return (f"  chain port_{rule.host_port} {{\n{''.join(lines)}"
            f'    counter drop comment "lease {lease_id} port {rule.container_port}: '
            'source not allowed"\n  }\n')


def _elements(items: str) -> str:
    return f"elements = {{ {items} }}; " if items else ""


def _strip(value):
    """The table without what changes on its own (handles, counter values)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in ("handle", "packets", "bytes")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _fingerprint(objects) -> str:
    return json.dumps(_strip([o for o in objects if "metainfo" not in o]), sort_keys=True)


def _counter_bytes(objects) -> dict[int, int]:
    found = {}
    for obj in objects:
        counter = obj.get("counter")
        if counter and counter.get("name", "").startswith("egress_"):
            found[int(counter["name"][len("egress_"):])] = counter.get("bytes", 0)
    return found


def boot_table(*, blocked_networks, masquerade: bool) -> bytes:
    """The agent's table with no lease, for nftables.service to load at boot before the
    agent first runs (`gpu-node-agent boot-filter`, install-node.sh). The agent replaces it
    with the current one when it starts."""
    packet_filter = PacketFilter(blocked_networks=blocked_networks, masquerade=masquerade)
    return packet_filter._boot_script(frozenset()).encode()
