"""Fleet facts for pages of other apps, without those apps importing fleet: the customer's
instance panel on the lease page, the FakeAgent banner and node health in the admin."""
from dataclasses import dataclass

from django import template
from django.db.models import Exists
from django.utils import timezone

from core.memo import memo_on_instance
from inventory.burnin import last_passed_burn_in
from rental.agent import agent_is_fake
from rental.models import Lease, LeaseState

from ..desired import current_node, current_node_id
from ..health import fleet_panel
from ..models import InstanceIntent, InstanceReport

register = template.Library()
S = LeaseState


@dataclass
class InstanceView:
    lease: Lease
    report: InstanceReport | None
    stopped_by_customer: bool

    @property
    def can_restart(self) -> bool:
        return self.lease.state == S.ACTIVE and not self.stopped_by_customer

    @property
    def can_stop(self) -> bool:
        return self.can_restart

    @property
    def can_start(self) -> bool:
        return self.lease.state == S.ACTIVE and self.stopped_by_customer

    @property
    def restore_pending(self):
        """The customer's restore into this disk under way, else None."""
        from rental.storage import restore_into_pending

        return restore_into_pending(self.lease)

    @property
    def restorable(self) -> list:
        """The customer's ready snapshots this stopped lease's disk can be replaced with:
        copies at the lease's site (any of its nodes), and on the demo (FakeAgent) its simulated
        ones too (restored at once, rental.storage.lease_restore_into)."""
        stopped = (self.lease.state == S.ACTIVE and self.stopped_by_customer) or self.lease.state == S.SUSPENDED
        if not stopped or self.restore_pending is not None:
            return []
        from django.db.models import Q

        from rental.models import Snapshot

        return list(Snapshot.objects.filter(customer_id=self.lease.customer_id, site_id=self.lease.site_id,
                                            state=Snapshot.State.AVAILABLE, key_destroyed_at__isnull=True,
                                            purpose=Snapshot.Purpose.CUSTOMER)
                    .filter(~Q(restic_snapshot="") | Q(repository="") if agent_is_fake() else ~Q(restic_snapshot=""))
                    .order_by("-ready_at", "-pk")[:20])

    @property
    def burn_in_passed_at(self):
        """When the lease's cards last passed a burn-in (before the lease began)."""
        return last_passed_burn_in(self.lease.pk)


@memo_on_instance
def node_and_report(lease: Lease) -> tuple[int | None, InstanceReport | None]:
    """The node holding the lease and its last report of the instance (None, None when the
    lease is on no node); asked once per render by every panel that shows the instance."""
    # the report of the node the lease is on, and whether the customer stopped the instance
    # (the instance panel asks next), in one query: only a lease whose node has not reported
    # it yet (provisioning) asks for the node alone
    report = (InstanceReport.objects.filter(lease=lease, node_id=current_node(lease.pk))
              .annotate(customer_stopped=Exists(_stopped_by_customer(lease))).first())
    if report is not None:
        return report.node_id, report
    return current_node_id(lease.pk), None


def _stopped_by_customer(lease: Lease):
    return InstanceIntent.objects.filter(lease=lease, stopped_by_customer=True)


@register.simple_tag
@memo_on_instance
def instance_view(lease: Lease) -> InstanceView | None:
    """The instance as the node holding the lease last reported it, and what the
    customer may do with it. None once the lease is not on a host."""
    if lease.state not in (S.PROVISIONING, S.ACTIVE, S.SUSPENDED):
        return None
    _node_id, report = node_and_report(lease)
    stopped = report.customer_stopped if report is not None else _stopped_by_customer(lease).exists()
    return InstanceView(lease=lease, report=report, stopped_by_customer=stopped)


@register.simple_tag
@memo_on_instance
def sanitization_record_available(lease) -> bool:
    """Whether the lease's signed sanitization record can be downloaded (a key destruction
    was proven by a node)."""
    from ..records import record_proofs

    return isinstance(lease, Lease) and bool(record_proofs(lease))


@register.simple_tag
def host_agent_is_fake() -> bool:
    return agent_is_fake()


@register.inclusion_tag("admin/fleet/_panel.html")
def fleet_health_panel():
    return {"panel": fleet_panel(timezone.now())}
