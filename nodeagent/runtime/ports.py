"""Host ports for the instances' sshd: one per lease from the configured range, stable
for the lease's whole life (the customer's connection line does not change on restart)."""
from pathlib import Path

from ..interfaces import OperationFailed
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
