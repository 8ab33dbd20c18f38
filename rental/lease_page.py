"""What the lease page shows beyond the lease row: the hardware incident its
instance is in, the latest move to other hardware, whether anything is in progress (the page
polls itself while it is), and the customer's unread notices for the header.

Reads only; the writes are inventory.incidents, rental.failover and rental.services. The
lease's events are read once (`Lease.events_of`: the page prefetches them, rental.views) and
every part here filters them in Python: the page lists them all anyway."""
from dataclasses import dataclass
from datetime import datetime, timedelta

from inventory.models import Downtime, Incident

from .models import Lease, LeaseState, Notification

#: A customer's restart/stop/start is "in progress" this long after it was asked for: the
#: node applies it on its next poll (NODE_POLL_SECONDS) and reports back on the one after.
INSTANCE_ACTION_SETTLES = timedelta(minutes=2)
INSTANCE_ACTIONS = ("instance_restart", "instance_stop", "instance_start",
                    "workbench_changed")    # the container is recreated (and its image maybe pulled)
#: A move to other hardware is shown on the lease page for this long after it happened.
MIGRATION_SHOWN_FOR = timedelta(days=7)
POLLING_STATES = (LeaseState.PENDING, LeaseState.PROVISIONING)


@dataclass(frozen=True)
class OpenIncident:
    kind: str          # Incident.Kind: down or degraded
    since: datetime


@dataclass(frozen=True)
class Migration:
    at: datetime
    minutes: int
    disk_copied: bool


def open_incident(lease: Lease) -> OpenIncident | None:
    """The worst open downtime of the lease (down before degraded), if its hardware is in an
    open incident now."""
    if lease.state not in (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED):
        return None
    rows = list(Downtime.objects.filter(lease_id=lease.pk, ends_at__isnull=True, incident__ends_at__isnull=True)
                .values_list("kind", "starts_at"))
    if not rows:
        return None
    kind, since = min(rows, key=lambda r: (r[0] != Incident.Kind.DOWN, r[1]))
    return OpenIncident(kind=kind, since=since)


#: The lease page lists at most this many of the incidents that affected the lease.
DOWNTIMES_SHOWN = 10


def lease_downtimes(lease: Lease) -> list[Downtime]:
    """Every incident that affected the lease, open or over, newest first: what its SLA
    credit is computed from, so the customer sees it on the lease's page."""
    return list(Downtime.objects.filter(lease_id=lease.pk).order_by("-starts_at", "-pk")[:DOWNTIMES_SHOWN])


def last_migration(lease: Lease, now: datetime) -> Migration | None:
    moves = [e for e in lease.events_of("migrated") if e.at >= now - MIGRATION_SHOWN_FOR]
    if not moves:
        return None
    event = moves[-1]
    data = event.data or {}
    return Migration(at=event.at, minutes=int(data.get("seconds", 0)) // 60,
                     disk_copied="not copied" not in str(data.get("nvme", "")))


def in_progress(lease: Lease, now: datetime, incident: OpenIncident | None) -> bool:
    """Something the customer is waiting for: payment, provisioning, an instance action the
    node has not applied yet, or hardware being repaired or replaced."""
    if lease.state in POLLING_STATES or incident is not None:
        return True
    if lease.restore_from_id is not None and lease.restored_at is None:
        return True         # a snapshot being restored onto its disk
    return any(e.at >= now - INSTANCE_ACTION_SETTLES for e in lease.events_of(*INSTANCE_ACTIONS))


def lease_page_context(lease: Lease, now: datetime) -> dict:
    incident = open_incident(lease)
    snapshots = list(lease.snapshots.exclude(state="deleted").order_by("-created_at", "-pk")[:10])
    taking = any(s.state == "creating" for s in snapshots)       # progress while the node copies
    return {"incident": incident, "migration": last_migration(lease, now), "snapshots": snapshots,
            "downtimes": lease_downtimes(lease),
            "snapshottable": lease.state in ("active", "suspended"),
            "polling": taking or in_progress(lease, now, incident)}


def unread_notices(user) -> int:
    if not getattr(user, "is_authenticated", False):
        return 0
    return Notification.objects.filter(customer=user, read_at__isnull=True).count()
