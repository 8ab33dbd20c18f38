"""Host ports for the instances' sshd: one per lease from the configured range, stable
for the lease's whole life (the customer's connection line does not change on restart);
and the customers' own published ports (Jupyter, TensorBoard, an API), each on a host port
of a range of their own, with the sources each may be reached from (nodeagent/netfilter.py
enforces them; docs/adr/0015-instance-ports.md)."""
import ipaddress
from pathlib import Path

from ..interfaces import OperationFailed, PublishedPort
from ..state import read_json, write_json


class PortBook:
    def __init__(self, path: Path, port_range: tuple[int, int]):
        self.path, self.low, self.high = path, *port_range

    def port_for(self, lease_id: int, taken: frozenset[int] = frozenset()) -> int:
        """The lease's port: the one booked, else the lowest free one. ``taken``: ports that
        instances already on this host publish (a book lost with the state directory must not
        hand their port out again: two leases on one port break the packet filter's port map,
        and with it every lease's filter)."""
        book = read_json(self.path, {})
        if str(lease_id) in book:
            return book[str(lease_id)]
        used = set(book.values()) | set(taken)
        free = (p for p in range(self.low, self.high + 1) if p not in used)
        port = next(free, None)
        if port is None:
            raise OperationFailed("no_free_port",
                                  f"every port in {self.low}-{self.high} is taken")
        write_json(self.path, {**book, str(lease_id): port})
        return port

    def release(self, lease_id: int) -> None:
        book = read_json(self.path, {})
        if book.pop(str(lease_id), None) is not None:
            write_json(self.path, book)


# -- the customers' own published ports (a desired item's `ports`) --------------------------
SSHD_PORT = 22           # the instance's sshd: published by the agent on the ssh range


def parse_ports(raw, *, limit: int | None = None) -> tuple[PublishedPort, ...]:
    """A desired item's `ports` (`[{"port": 8888, "allow": ["203.0.113.0/24", "::/0"]}]`),
    checked and normalised: TCP ports 1-65535 but the sshd's, each once, each allow entry an
    IPv4 or IPv6 network (host bits cleared, a bare address is a /32 or /128). Absent or
    null: none. `limit`: the node's most per lease. A bad entry raises `bad_ports` naming
    it, so the lease fails with that message before anything of its instance changes, and
    nothing of it reaches the packet filter (whose one table holds every lease)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(f"ports must be a list, not {type(raw).__name__}")
    if limit is not None and len(raw) > limit:
        raise _bad(f"{len(raw)} published ports asked; this node publishes at most {limit}")
    seen, parsed = set(), []
    for index, entry in enumerate(raw):
        where = f"ports[{index}]"
        if not isinstance(entry, dict) or set(entry) - {"port", "allow"}:
            raise _bad(f"{where} must be an object with `port` and `allow`: {entry!r:.100}")
        port = entry.get("port")
        if type(port) is not int or not 0 < port < 65536:
            raise _bad(f"{where}.port must be a TCP port 1-65535, not {port!r:.40}")
        if port == SSHD_PORT:
            raise _bad(f"{where}.port {port} is the instance's sshd, published already")
        if port in seen:
            raise _bad(f"{where}.port {port} is listed twice")
        seen.add(port)
        allow = entry.get("allow", [])
        if not isinstance(allow, list):
            raise _bad(f"{where}.allow must be a list of CIDRs")
        networks = []
        for cidr in allow:
            try:
                if not isinstance(cidr, str):
                    raise ValueError("not a string")
                networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
            except ValueError:
                raise _bad(f"{where}.allow: {cidr!r:.60} is not an IPv4 or IPv6 network "
                           "(e.g. 203.0.113.0/24, 2001:db8::/32)") from None
        parsed.append(PublishedPort(port=port, allow=normalise_networks(networks)))
    return tuple(sorted(parsed, key=lambda p: p.port))


def normalise_networks(networks) -> tuple[str, ...]:
    """Networks collapsed per family (IPv4 first): one canonical form per allow list, so
    the same sources always give the same table (and an nft interval set never sees two
    overlapping elements, which it refuses)."""
    parsed = [ipaddress.ip_network(n, strict=False) for n in networks]
    return tuple(str(n) for version in (4, 6) for n in ipaddress.collapse_addresses(
        p for p in parsed if p.version == version))


BAD_PORTS = "bad_ports"


def _bad(detail: str) -> OperationFailed:
    return OperationFailed(BAD_PORTS, detail)


class PublishedPortBook:
    """Host ports for the customers' published ports: one per (lease, container port) from
    a range of their own (`docker.published_port_range`), kept while the lease publishes
    that port, so the address a customer bookmarked survives restarts and recreations.
    The same rule as the ssh book: a port another instance publishes (`taken`, from the
    containers' labels) is never handed out again, even when this book was lost."""

    def __init__(self, path: Path, port_range: tuple[int, int]):
        self.path, self.low, self.high = path, *port_range

    def ports_for(self, lease_id: int, container_ports, taken: frozenset[int] = frozenset()
                  ) -> dict[int, int]:
        """container port -> host port for exactly these container ports (a port the lease
        no longer publishes is released)."""
        book = read_json(self.path, {})
        mine = {int(c): h for c, h in book.get(str(lease_id), {}).items()
                if int(c) in set(container_ports)}
        used = {h for lease, ports in book.items() if lease != str(lease_id)
                for h in ports.values()} | set(taken)
        for container_port in sorted(set(container_ports) - set(mine)):
            free = (p for p in range(self.low, self.high + 1)
                    if p not in used and p not in mine.values())
            port = next(free, None)
            if port is None:
                raise OperationFailed("no_free_port", f"every published port in "
                                      f"{self.low}-{self.high} is taken")
            mine[container_port] = port
        stored = {str(c): h for c, h in sorted(mine.items())}
        if book.get(str(lease_id), {}) != stored:
            write_json(self.path, {**{k: v for k, v in book.items() if k != str(lease_id)},
                                   **({str(lease_id): stored} if stored else {})})
        return mine

    def release(self, lease_id: int) -> None:
        book = read_json(self.path, {})
        if book.pop(str(lease_id), None) is not None:
            write_json(self.path, book)


class AllowBook:
    """Each lease's allowed sources per container port, as last sent by the storefront.
    Kept beside the containers (not in their labels) so an allow-list change rewrites the
    packet filter only, without recreating the instance. Lost with the state directory,
    the ports are closed (nobody allowed) until the next round sends the lists again."""

    def __init__(self, path: Path):
        self.path = path

    def get(self, lease_id: int) -> dict[int, tuple[str, ...]]:
        entry = read_json(self.path, {}).get(str(lease_id), {})
        return {int(c): tuple(allow) for c, allow in entry.items()}

    def set(self, lease_id: int, ports: tuple[PublishedPort, ...]) -> bool:
        """Store the lease's lists; True when they changed."""
        book = read_json(self.path, {})
        entry = {str(p.port): list(p.allow) for p in ports}
        if book.get(str(lease_id), {}) == entry:
            return False
        book[str(lease_id)] = entry
        write_json(self.path, book)
        return True

    def forget(self, lease_id: int) -> None:
        book = read_json(self.path, {})
        if book.pop(str(lease_id), None) is not None:
            write_json(self.path, book)
