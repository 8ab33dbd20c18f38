"""The rental side of the lifecycle sweeps. Each sweep selects due leases by an indexed
deadline in a bounded batch and applies one guarded transition per lease; a lease that
another run already moved is skipped. Returns the transitions made, for the command."""
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q
from django.utils.translation import gettext as _

from .agent import get_agent
from .models import DiskKey, Lease, LeaseState, Notification
from .services import (
    customer_language,
    disk_key_complete_destroy,
    lease_provisioned,
    lease_release,
    lease_suspend,
    lease_wipe,
    notify,
)

S = LeaseState
BATCH = 500


@dataclass(frozen=True)
class Transition:
    lease_id: int
    what: str


def _due_ids(queryset, order: str, limit: int) -> list[int]:
    return list(queryset.order_by(order).values_list("pk", flat=True)[:limit])


def sweep_provisioning(now: datetime, limit: int = BATCH) -> list[Transition]:
    agent, done = get_agent(), []
    for lease in Lease.objects.filter(state=S.PROVISIONING).order_by("provisioning_started_at")[:limit]:
        instance = agent.poll_ready(lease_id=lease.pk, started_at=lease.provisioning_started_at, now=now)
        if instance and lease_provisioned(lease_id=lease.pk, instance=instance, now=now):
            done.append(Transition(lease.pk, "provisioning → active"))
    return done


REMINDERS = [("reminder_3d", timedelta(days=3)), ("reminder_1d", timedelta(days=1))]


def sweep_reminders(now: datetime, limit: int = BATCH) -> list[Transition]:
    done = []
    for kind, before in REMINDERS:
        already = Notification.objects.filter(lease=OuterRef("pk"), kind=kind, deadline=OuterRef("ends_at"))
        due = (Lease.objects.filter(state=S.ACTIVE, ends_at__gt=now, ends_at__lte=now + before)
               .exclude(Exists(already)).select_related("customer", "offer__gpu_model").order_by("ends_at")[:limit])
        for lease in due:
            args = {"id": lease.pk, "offer": lease.offer, "end": f"{lease.ends_at:%Y-%m-%d %H:%M}"}
            with customer_language(lease.customer):
                subject = _("Lease #%(id)s (%(offer)s) ends %(end)s UTC") % args
                body = _("Your lease #%(id)s ends at %(end)s UTC. A renewal invoice is issued 24 hours before the "
                         "end. Unpaid, the instance is stopped and held 72 hours, then its disk key is "
                         "destroyed.") % args
            if notify(lease=lease, kind=kind, deadline=lease.ends_at, subject=subject, body=body):
                done.append(Transition(lease.pk, kind))
    return done


def sweep_suspend(now: datetime, limit: int = BATCH) -> list[Transition]:
    due = _due_ids(Lease.objects.filter(state=S.ACTIVE, ends_at__lte=now), "ends_at", limit)
    return [Transition(i, "active → suspended") for i in due if lease_suspend(lease_id=i, now=now)]


def sweep_release(now: datetime, limit: int = BATCH) -> list[Transition]:
    due = _due_ids(Lease.objects.filter(state=S.SUSPENDED, hold_until__lte=now), "hold_until", limit)
    return [Transition(i, "suspended → released") for i in due if lease_release(lease_id=i, now=now)]


def sweep_key_destruction(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Finishes phase two for keys whose first phase committed but whose worker died."""
    due = list(DiskKey.objects.filter(state=DiskKey.State.DESTROY_REQUESTED)
               .order_by("destroy_requested_at").values_list("lease_id", flat=True)[:limit])
    return [Transition(i, "key destroyed") for i in due if disk_key_complete_destroy(lease_id=i, now=now)]


def sweep_wipe(now: datetime, limit: int = BATCH) -> list[Transition]:
    ran = Q(state__in=[S.RELEASED, S.FAILED]) | Q(state=S.CANCELLED, provisioning_started_at__isnull=False)
    due = _due_ids(Lease.objects.filter(ran, wipe_by__lte=now, disk_key__state=DiskKey.State.DESTROYED),
                   "wipe_by", limit)
    return [Transition(i, "→ wiped") for i in due if lease_wipe(lease_id=i, now=now)]
