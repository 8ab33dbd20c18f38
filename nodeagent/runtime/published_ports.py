"""A lease's published ports in its container (docs/adr/0015-instance-ports.md): the label
that records them, the node's limits on them, the host ports they are given, and the packet
filter's rules that admit their allowed sources (nodeagent/runtime/docker.py uses them)."""
import json
import logging

from ..interfaces import InstanceSpec, OperationFailed
from ..netfilter import PortRule
from .container_options import LABEL_LEASE
from .ports import BAD_PORTS, SSHD_PORT, normalise_networks

log = logging.getLogger(__name__)

# The customer's published ports, {"<container port>": <host port>} (JSON): what the packet
# filter opens, and what a lost port book must not hand out again.
LABEL_PUBLISHED = "gpu-node-agent.published-ports"


class PublishedPorts:
    """DockerRuntime's published ports: the customer's own, beside the instance's sshd."""

    def _published_by_others(self, *, but: int) -> frozenset[int]:
        """Host ports the other instances publish for their customers (their labels)."""
        containers = self._call(self.client.containers.list, all=True, filters={"label": LABEL_LEASE})
        return frozenset(port for c in containers if c.labels[LABEL_LEASE] != str(but)
                         for _, port in _published(c.labels))

    @property
    def max_published_ports(self) -> int:
        return self.config.max_published_ports

    def _check_ports(self, spec: InstanceSpec) -> None:
        """The node's limits, before anything of the instance changes."""
        wanted = [p.port for p in spec.ports]
        if len(wanted) > self.config.max_published_ports:
            raise OperationFailed(BAD_PORTS, f"{len(wanted)} published ports asked; "
                                  f"this node publishes at most {self.config.max_published_ports}")
        if SSHD_PORT in wanted:
            raise OperationFailed(BAD_PORTS, f"port {SSHD_PORT} is the instance's sshd")

    def _publish(self, spec: InstanceSpec) -> dict[int, int]:
        """The customer's ports: container port -> host port."""
        return self.published.ports_for(spec.lease_id, [p.port for p in spec.ports],
                                        taken=self._published_by_others(but=spec.lease_id))

    def _port_rules(self, lease_id: int, labels: dict) -> tuple[PortRule, ...]:
        """The lease's published ports with their allowed sources. A list that no longer
        parses (the state file edited by hand) closes that port, never the whole table."""
        allows = self.allows.get(lease_id)
        rules = []
        for container_port, host_port in _published(labels):
            try:
                allow = normalise_networks(allows.get(container_port, ()))
            except (TypeError, ValueError) as exc:
                log.error("lease %s: port %s's allowed sources are unreadable (%s): closed",
                          lease_id, container_port, exc)
                allow = ()
            rules.append(PortRule(host_port, container_port, allow))
        return tuple(rules)


def _published(labels: dict) -> tuple[tuple[int, int], ...]:
    """(container port, host port) pairs from a container's label; none if unreadable."""
    try:
        ports = json.loads(labels.get(LABEL_PUBLISHED) or "{}")
        return tuple(sorted((int(c), int(h)) for c, h in ports.items()))
    except (TypeError, ValueError, AttributeError):
        return ()


def _published_label(published: dict[int, int]) -> dict[str, str]:
    if not published:
        return {}
    return {LABEL_PUBLISHED: json.dumps({str(c): h for c, h in sorted(published.items())})}
