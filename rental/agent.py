"""The host-agent interface: how the storefront asks a node to provision, stop, resume,
destroy a disk key and wipe. Real agents speak HTTPS to the nodes; dev and tests use
FakeAgent, which "provisions" in HOST_AGENT_FAKE_DELAY seconds and signs receipts with
the server's secret so the destruction record can be shown and checked. The production
agent is fleet.driver.NodeAgentDriver (settings.HOST_AGENT): there `destroy_key` and `wipe`
return None until the node's signed evidence arrived ("not yet, retry on the next pass")."""
import hashlib
import hmac
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from .addresses import valid_host, valid_port


@dataclass(frozen=True)
class Instance:
    host: str
    ssh_port: int
    # the node's signing key, as the customer is given it to check records later
    # (nodeagent.signing.fingerprint); "" where no node agent signs (FakeAgent)
    node_key_fingerprint: str = ""

    def __post_init__(self):
        """Only a checked host and port become a customer's connection."""
        if valid_host(self.host) is None or valid_port(self.ssh_port) is None:
            raise ValueError(f"not a valid host and port: {self.host!r}:{self.ssh_port!r}")


class HostAgent(Protocol):
    def start_provisioning(self, *, lease_id: int, node: str, ssh_public_key: str, key_ref: str) -> None: ...
    def poll_ready(self, *, lease_id: int, started_at: datetime, now: datetime) -> Instance | None: ...
    def stop(self, *, lease_id: int) -> None: ...
    def resume(self, *, lease_id: int) -> None: ...
    def destroy_key(self, *, lease_id: int, key_ref: str, at: datetime) -> str | None: ...
    def wipe(self, *, lease_id: int, at: datetime) -> str | None: ...


def agent_is_fake(agent=None) -> bool:
    """True when the configured agent only pretends (demo, tests): shown on admin pages."""
    return isinstance(agent or get_agent(), FakeAgent)


class FakeAgent:
    """Pretends: no instance exists anywhere. For the demo (`make run`) and tests only."""

    def start_provisioning(self, *, lease_id, node, ssh_public_key, key_ref):
        return None

    def poll_ready(self, *, lease_id, started_at, now):
        delay = timedelta(seconds=getattr(settings, "HOST_AGENT_FAKE_DELAY", 180))
        if now - started_at < delay:
            return None
        return Instance(host=f"lease-{lease_id}.gpu.local", ssh_port=22000 + lease_id % 10000)

    def stop(self, *, lease_id):
        return None

    def resume(self, *, lease_id):
        return None

    def _receipt(self, action: str, lease_id: int, ref: str, at: datetime) -> str:
        message = f"{action}:{lease_id}:{ref}:{at.isoformat()}"
        mac = hmac.new(settings.SECRET_KEY.encode(), message.encode(), hashlib.sha256).hexdigest()
        return f"{message}:hmac-sha256={mac}"

    def destroy_key(self, *, lease_id, key_ref, at):
        return self._receipt("luks-key-destroyed", lease_id, key_ref, at)

    def wipe(self, *, lease_id, at):
        return self._receipt("nvme-wiped", lease_id, "blkdiscard", at)


_override: list[HostAgent] = []


def get_agent() -> HostAgent:
    if _override:
        return _override[-1]
    return import_string(getattr(settings, "HOST_AGENT", "rental.agent.FakeAgent"))()


@contextmanager
def agent_override(agent: HostAgent):
    """Use `agent` instead of the configured one (dry runs, tests)."""
    _override.append(agent)
    try:
        yield agent
    finally:
        _override.pop()
