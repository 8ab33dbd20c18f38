"""Node health for operators (admin node list, ops dashboard): when each enrolled node
last reported, its agent version and GPUs, and the alerts an operator acts on. One
query for the nodes (with their agents) plus one for open GPU incidents."""
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils.translation import gettext as _

from inventory.models import Incident, Node
from rental.agent import agent_is_fake
from rental.models import Lease, LeaseState

from .models import InstanceReport, NodeAgent

RECENT_FAILURES = timedelta(days=7)


@dataclass
class NodeHealth:
    node: Node
    agent: NodeAgent | None
    now: datetime
    open_gpu_incidents: int = 0
    alerts: list[str] = field(default_factory=list)

    @property
    def report_age(self) -> timedelta | None:
        if self.agent is None or self.agent.last_report_at is None:
            return None
        return max(timedelta(0), self.now - self.agent.last_report_at)

    @property
    def stale(self) -> bool:
        """Enrolled, and no report within NODE_REPORT_STALE_AFTER."""
        if self.agent is None or self.agent.credential_hash is None:
            return False
        age = self.report_age
        return age is None or age > settings.NODE_REPORT_STALE_AFTER

    @property
    def gpus_reported(self) -> int:
        return len(self.agent.gpus) if self.agent else 0


def _alerts(h: NodeHealth) -> list[str]:
    name = h.node.name
    if h.agent is None or h.agent.credential_hash is None:
        return []
    alerts = []
    if h.stale:
        age = h.report_age
        alerts.append(_("Node %(node)s is not reporting (last report %(age)s ago).")
                      % {"node": name, "age": f"{int(age.total_seconds() // 60)} min"} if age else
                      _("Node %(node)s is enrolled but has never reported.") % {"node": name})
    if h.agent.gpu_library == "none":
        alerts.append(_("Node %(node)s has no GPU library (NVML): it reports no GPUs.") % {"node": name})
    elif h.agent.last_report_at and h.gpus_reported != h.node.gpu_count:
        alerts.append(_("Node %(node)s reports %(seen)s GPU(s) but has %(slots)s slot(s).")
                      % {"node": name, "seen": h.gpus_reported, "slots": h.node.gpu_count})
    if h.open_gpu_incidents:
        alerts.append(_("Node %(node)s: %(count)s GPU(s) unhealthy (open health-check incidents).")
                      % {"node": name, "count": h.open_gpu_incidents})
    return alerts


def node_health(now: datetime, nodes=None) -> list[NodeHealth]:
    nodes = list(nodes if nodes is not None else Node.objects.select_related("site", "agent").order_by(
        "site__code", "name"))
    open_gpu = {}
    for node_id in Incident.objects.filter(ends_at__isnull=True, source=Incident.Source.HEALTH_CHECK,
                                           slot__node__in=nodes).values_list("slot__node_id", flat=True):
        open_gpu[node_id] = open_gpu.get(node_id, 0) + 1
    rows = []
    for node in nodes:
        row = NodeHealth(node=node, agent=getattr(node, "agent", None), now=now,
                         open_gpu_incidents=open_gpu.get(node.pk, 0))
        row.alerts = _alerts(row)
        rows.append(row)
    return rows


@dataclass
class FleetPanel:
    fake_agent: bool
    nodes: list[NodeHealth]
    failed_leases: list[Lease]
    instance_errors: list[InstanceReport]

    @property
    def enrolled(self) -> list[NodeHealth]:
        return [h for h in self.nodes if h.agent and h.agent.credential_hash]

    @property
    def alerts(self) -> list[str]:
        return [a for h in self.nodes for a in h.alerts]


def fleet_panel(now: datetime) -> FleetPanel:
    failed = list(Lease.objects.filter(state=LeaseState.FAILED, ended_at__gte=now - RECENT_FAILURES)
                  .select_related("customer", "offer__gpu_model", "site").order_by("-ended_at", "-pk")[:50])
    # Live leases whose node says the last operation failed (image missing, GPU gone, …).
    errors = list(InstanceReport.objects.filter(error__isnull=False, lease__state__in=[
        LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED])
        .select_related("node", "lease").order_by("-reported_at", "-pk")[:50])
    return FleetPanel(fake_agent=agent_is_fake(), nodes=node_health(now), failed_leases=failed,
                      instance_errors=errors)
