"""Suspension and release notices, through the outbox (rental.models.Notification, one row
per (lease, kind, deadline)): a sweep finds leases in those states without their notice and
sends it, so a notice goes out once however the lease got there (the lifecycle sweep, an
operator's action) and however often the sweep runs. Always in-app; e-mailed when the
customer gave an address (rental.services.notify)."""
from datetime import datetime

from django.db.models import Exists, OuterRef

from .lifecycle import BATCH, Transition
from .models import Lease, LeaseState, Notification
from .services import notify

S = LeaseState


def _missing(kind: str, deadline_field: str):
    return Notification.objects.filter(lease=OuterRef("pk"), kind=kind, deadline=OuterRef(deadline_field))


def sweep_state_notices(now: datetime, limit: int = BATCH) -> list[Transition]:
    done = []
    suspended = (Lease.objects.filter(state=S.SUSPENDED, hold_until__isnull=False)
                 .exclude(Exists(_missing("suspended", "hold_until")))
                 .select_related("customer", "offer__gpu_model").order_by("hold_until")[:limit])
    for lease in suspended:
        subject = f"Lease #{lease.pk} ({lease.offer}) is suspended: pay by {lease.hold_until:%Y-%m-%d %H:%M} UTC"
        body = (f"The term of lease #{lease.pk} ended unpaid at {lease.ends_at:%Y-%m-%d %H:%M} UTC. The instance is "
                f"stopped; its GPU slot and disk are held until {lease.hold_until:%Y-%m-%d %H:%M} UTC. Paying the "
                "renewal invoice before then resumes it. After that the slot is released and the disk key is "
                "destroyed: data on the local NVMe cannot be recovered.")
        if notify(lease=lease, kind="suspended", deadline=lease.hold_until, subject=subject, body=body):
            done.append(Transition(lease.pk, "suspension notice"))
    # Released within the last days (the wipe deadline is still ahead): older ones are history.
    released = (Lease.objects.filter(state=S.RELEASED, ended_at__isnull=False, wipe_by__gte=now)
                .exclude(Exists(_missing("released", "ended_at")))
                .select_related("customer", "offer__gpu_model").order_by("wipe_by")[:limit])
    for lease in released:
        subject = f"Lease #{lease.pk} ({lease.offer}) was released"
        body = (f"Lease #{lease.pk} was released at {lease.ended_at:%Y-%m-%d %H:%M} UTC after its 72-hour hold "
                "ended unpaid. Its GPU slot is back in stock and the disk encryption key is destroyed; the local "
                f"NVMe is wiped by {lease.wipe_by:%Y-%m-%d %H:%M} UTC. Network volumes and snapshots are kept.")
        if notify(lease=lease, kind="released", deadline=lease.ended_at, subject=subject, body=body):
            done.append(Transition(lease.pk, "release notice"))
    return done
