"""Signed evidence waiting for the storefront. It survives restarts and storefront
outages and leaves only once a report carrying it was answered."""
from .state import read_json, write_json


class Outbox:
    def __init__(self, path):
        self.path = path

    def add(self, record: dict) -> None:
        write_json(self.path, read_json(self.path, []) + [record])

    def pending(self) -> list[dict]:
        return read_json(self.path, [])

    def delivered(self, records: list[dict]) -> None:
        sent = {r["signature"] for r in records}
        write_json(self.path, [r for r in self.pending() if r["signature"] not in sent])
