"""After an agent upgrade, each running instance must still reach its GPUs.

An upgrade restarts the agent and may reload systemd (install-node.sh runs a daemon-reload
when the unit changed). Where that detached a container's GPUs (the hazard the start check
`gpu_reload` guards against, nodeagent/preflight.py), the tenant's CUDA fails with "Failed to
initialize NVML: Unknown Error" while the container runs on. So on the first round after the
agent's version changed, every running instance is asked, from inside, to open each NVIDIA
device node it holds; one it cannot open names the condition `gpu_detached` on the lease's
GPUs, which the storefront turns into an incident (fleet/conditions.py), until the instance
reaches them again (asked every round while flagged: an operator restarted it).

docs/adr/0013-burn-in-by-card-class.md."""
import logging
from dataclasses import replace
from pathlib import Path

from .health import Condition, legacy_verdict

log = logging.getLogger(__name__)

VERSION_FILE = "agent-version"
# Run inside the container: each NVIDIA device node present that cannot be opened, one a line.
# A node the device cgroup no longer admits fails open() with EPERM. (`true`, not `:`: a
# failed redirection of a special builtin ends a POSIX shell.)
PROBE = ('n=0; for d in /dev/nvidiactl /dev/nvidia[0-9]* "$@"; do [ -e "$d" ] || continue; n=$((n+1)); '
         'true < "$d" 2>/dev/null || echo "unreachable $d"; done; echo "seen $n"')


def version_changed(state_root, version: str) -> str | None:
    """The previous version when this start is the first of a new one ("" on a node's first
    start ever: nothing ran before it); records the current one."""
    path = Path(state_root) / VERSION_FILE
    try:
        previous = path.read_text().strip()
    except OSError:
        previous = None
    if previous != version:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(version + "\n")
    return None if previous == version else (previous or "")


def parse_probe(output: str) -> tuple[int, list[str]]:
    """(device nodes seen, those that could not be opened) from PROBE's output."""
    seen, unreachable = 0, []
    for line in (output or "").splitlines():
        word, _, rest = line.partition(" ")
        if word == "unreachable":
            unreachable.append(rest.strip())
        elif word == "seen" and rest.strip().isdigit():
            seen = int(rest.strip())
    return seen, unreachable


class AttachmentCheck:
    """Asks the runtime (`gpu_access(lease_id)` -> {"uuids", "seen", "unreachable"} or None)
    after an upgrade, and keeps the leases whose GPUs it found detached."""

    def __init__(self, state_root, version: str):
        previous = version_changed(state_root, version)
        self.due = previous is not None and previous != ""     # an upgrade, not a first start
        self.previous, self.version = previous, version
        self.detached: dict[int, dict] = {}                    # lease id -> what was found

    def apply(self, gpus: list, runtime) -> list:
        """The GPUs with `gpu_detached` on every GPU of a lease that cannot reach them."""
        access = getattr(runtime, "gpu_access", None)
        if access is None:
            return gpus
        leases = list(runtime.lease_ids()) if self.due else list(self.detached)
        if self.due:
            log.info("agent upgraded from %s to %s: checking that each instance still reaches its GPUs",
                     self.previous, self.version)
            self.due = False
        for lease_id in leases:
            try:
                found = access(lease_id)
            except Exception as exc:       # a runtime error must not stop the round
                log.warning("lease %s: GPU access not checked: %s", lease_id, exc)
                continue
            if found and found["uuids"] and (found["unreachable"] or not found["seen"]):
                if lease_id not in self.detached:
                    log.error("lease %s: its instance no longer reaches its GPUs (%s)", lease_id,
                              ", ".join(found["unreachable"]) or "no NVIDIA device node")
                self.detached[lease_id] = found
            elif self.detached.pop(lease_id, None) is not None:
                log.info("lease %s: its instance reaches its GPUs again", lease_id)
        return [self._marked(g) for g in gpus]

    def _marked(self, gpu):
        for lease_id, found in self.detached.items():
            if gpu.uuid in found["uuids"]:
                why = ", ".join(found["unreachable"]) or "no NVIDIA device node in the container"
                condition = Condition("gpu_detached", f"lease {lease_id}'s instance cannot open its GPU "
                                                      f"after the agent upgrade: {why}"[:200])
                conditions = (*gpu.conditions, condition)
                _, problem = legacy_verdict(list(conditions))
                return replace(gpu, conditions=conditions, healthy=False, problem=problem or condition.detail)
        return gpu
