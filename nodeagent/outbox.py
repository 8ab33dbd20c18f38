"""Signed evidence waiting for the storefront. It survives restarts and storefront
outages; a record leaves once the storefront accepted or refused it (PROTOCOL.md: resend
until accepted, drop when refused)."""
import threading

from .state import read_json, write_json


class Outbox:
    """Shared by the converge loop and the burn-in worker thread: every read-modify-write
    holds the lock, so a record added while another is settled is never lost."""

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()

    def add(self, record: dict) -> None:
        with self._lock:
            write_json(self.path, read_json(self.path, []) + [record])

    def pending(self) -> list[dict]:
        return read_json(self.path, [])

    def settle(self, sent: list[dict], answer: dict) -> list[tuple[dict, str]]:
        """Drop the sent records the answer accepted or refused; return the refused ones
        with their error. Records the answer does not mention are sent again."""
        with self._lock:
            return self._settle(sent, answer)

    def _settle(self, sent: list[dict], answer: dict) -> list[tuple[dict, str]]:
        refused = {r.get("item"): r.get("error", "") for r in answer.get("refused", [])}
        accepted = set(answer.get("accepted", []))
        answered, dropped = set(), []
        for i, record in enumerate(sent):
            label = f"evidence[{i}]"
            if label in accepted or label in refused:
                answered.add(record["signature"])
            if label in refused:
                dropped.append((record, refused[label]))
        write_json(self.path, [r for r in self.pending() if r["signature"] not in answered])
        return dropped
