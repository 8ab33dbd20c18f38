"""Which operations (by `op_id`) the agent finished, so a restart does not redo them, and
the last named failure per lease, so it is reported until an attempt succeeds."""
from datetime import UTC, datetime

from .state import read_json, write_json


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Journal:
    KEEP_DONE_PER_LEASE = 20  # older finished op_ids of a lease can never come back

    def __init__(self, path):
        self.path = path
        data = read_json(path, {})
        self._done: dict[str, dict] = data.get("done", {})
        self._errors: dict[str, dict] = data.get("errors", {})

    def is_done(self, op_id: str) -> bool:
        return op_id in self._done

    def done(self, lease_id: int, op_id: str, **facts) -> None:
        self._done[op_id] = {"lease_id": lease_id, "at": utc_now(), **facts}
        self._errors.pop(str(lease_id), None)
        self._forget_old(lease_id)
        self._save()

    def failed(self, lease_id: int, op_id: str, code: str, detail: str) -> None:
        self._errors[str(lease_id)] = {"op_id": op_id, "code": code, "detail": detail[:2000]}
        self._save()

    def error_for(self, lease_id: int, op_id: str) -> dict | None:
        error = self._errors.get(str(lease_id))
        if error and error["op_id"] == op_id:
            return {"code": error["code"], "detail": error["detail"]}
        return None

    def leases(self) -> set[int]:
        return {v["lease_id"] for v in self._done.values()}

    def forget_lease(self, lease_id: int) -> None:
        """Drop everything about a lease that is over (its disk wiped, no longer listed)."""
        self._done = {k: v for k, v in self._done.items() if v["lease_id"] != lease_id}
        self._errors.pop(str(lease_id), None)
        self._save()

    def finished(self) -> dict[str, dict]:
        return dict(self._done)

    def _forget_old(self, lease_id: int) -> None:
        mine = sorted((v["at"], k) for k, v in self._done.items() if v["lease_id"] == lease_id)
        for _, op_id in mine[: -self.KEEP_DONE_PER_LEASE]:
            del self._done[op_id]

    def _save(self) -> None:
        write_json(self.path, {"done": self._done, "errors": self._errors})
