"""Cumulative egress per lease. Docker's network counters (tx_bytes) restart from zero
whenever the container restarts, so the agent keeps a running total on disk."""
from pathlib import Path

from ..state import read_json, write_json


class EgressMeter:
    def __init__(self, path: Path):
        self.path = path

    def observe(self, lease_id: int, counter: int | None) -> int:
        """Fold the container's current tx counter (None: not running) into the total."""
        book = read_json(self.path, {})
        entry = book.get(str(lease_id), {"total": 0, "last": 0})
        if counter is not None:
            # A counter below the last reading means the container restarted from zero.
            grown = counter - entry["last"] if counter >= entry["last"] else counter
            entry = {"total": entry["total"] + grown, "last": counter}
        elif entry["last"]:
            entry = {**entry, "last": 0}
        if book.get(str(lease_id)) != entry:
            write_json(self.path, {**book, str(lease_id): entry})
        return entry["total"]

    def forget(self, lease_id: int) -> None:
        book = read_json(self.path, {})
        if book.pop(str(lease_id), None) is not None:
            write_json(self.path, book)
