"""The rental side of the lifecycle sweeps. Each sweep selects due leases by an indexed
deadline in a bounded batch and applies one guarded transition per lease; a lease that
another run already moved is skipped. Returns the transitions made, for the command."""
from datetime import datetime

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils.translation import gettext as _

from . import rules
from .agent import get_agent
from .disk_keys import disk_keys_complete_destroy
from .events import Transition
from .models import WIPE_PENDING, DiskKey, Lease, LeaseState, Notification
from .notifications.notices import Notice, notify_many
from .services import (
    customer_language,
    lease_provisioned,
    leases_release,
    leases_suspend,
    leases_wipe,
)

S = LeaseState
BATCH = 500
#: What the sweeps that write to customers read with each due lease: the notice's language
#: and the auto-renew choice come from the customer's settings row, not a query per lease.
DUE_LEASE_RELATED = ("customer__rental_settings", "offer__gpu_model")


def _due_ids(queryset, order: str, limit: int) -> list[int]:
    return list(queryset.order_by(order, "pk").values_list("pk", flat=True)[:limit])


def sweep_provisioning(now: datetime, limit: int = BATCH) -> list[Transition]:
    agent, done = get_agent(), []
    for lease in Lease.objects.filter(state=S.PROVISIONING).order_by("provisioning_started_at", "pk")[:limit]:
        instance = agent.poll_ready(lease_id=lease.pk, started_at=lease.provisioning_started_at, now=now)
        if instance and lease_provisioned(lease_id=lease.pk, instance=instance, now=now):
            done.append(Transition(lease.pk, "provisioning → active"))
    return done


def sweep_reminders(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Each reminder is due from its moment (end − lead) until the term ends, so one missed
    by late beats is sent late. Only the most urgent due one goes out: a lease that missed
    its 3-day reminder and is now within a day gets the 1-day one alone. Once the term has
    ended, the suspension notice (with the real hold end) takes their place. Each kind's
    batch is sent as one (notify_many)."""
    done, sent_kinds = [], []
    for kind, lead in sorted(rules.reminders(), key=lambda item: item[1]):  # shortest lead first
        sent_kinds.append(kind)
        already = Notification.objects.filter(lease=OuterRef("pk"), kind__in=list(sent_kinds),
                                              deadline=OuterRef("ends_at"))
        due = (Lease.objects.filter(state=S.ACTIVE, ends_at__gt=now, ends_at__lte=now + lead)
               .exclude(Exists(already)).select_related(*DUE_LEASE_RELATED).order_by("ends_at", "pk")[:limit])
        sent = notify_many([_reminder(lease, kind=kind) for lease in due], now=now)
        done += [Transition(notice.lease.pk, kind) for notice in sent]
    return done


def _reminder(lease: Lease, *, kind: str) -> Notice:
    args = {"id": lease.pk, "offer": lease.offer, "end": f"{lease.ends_at:%Y-%m-%d %H:%M}",
            "renewal_hours": settings.LEASE_RENEWAL_LEAD_HOURS, "hold_hours": settings.LEASE_HOLD_HOURS}
    with customer_language(lease.customer):
        subject = _("Lease #%(id)s (%(offer)s) ends %(end)s UTC") % args
        body = _("Your lease #%(id)s ends at %(end)s UTC. A renewal invoice is issued %(renewal_hours)s hours "
                 "before the end. Unpaid, the instance is stopped and held %(hold_hours)s hours, then its disk "
                 "key is destroyed.") % args
    return Notice(lease=lease, kind=kind, deadline=lease.ends_at, subject=subject, body=body)


def sweep_suspend(now: datetime, limit: int = BATCH) -> list[Transition]:
    due = _due_ids(Lease.objects.filter(state=S.ACTIVE, ends_at__lte=now), "ends_at", limit)
    return [Transition(i, "active → suspended") for i in leases_suspend(due, now=now)]


def sweep_release(now: datetime, limit: int = BATCH) -> list[Transition]:
    due = _due_ids(Lease.objects.filter(state=S.SUSPENDED, hold_until__lte=now), "hold_until", limit)
    return [Transition(i, "suspended → released") for i in leases_release(due, now=now)]


def sweep_key_destruction(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Finishes phase two for keys whose first phase committed but whose worker died."""
    due = list(DiskKey.objects.filter(state=DiskKey.State.DESTROY_REQUESTED)
               .order_by("destroy_requested_at", "pk").values_list("lease_id", flat=True)[:limit])
    return [Transition(i, "key destroyed") for i in disk_keys_complete_destroy(lease_ids=due, now=now)]


def sweep_wipe(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Wipes as soon as the key is destroyed; wipe_by is the deadline alerts watch."""
    due = _due_ids(Lease.objects.filter(WIPE_PENDING, disk_key__state=DiskKey.State.DESTROYED), "wipe_by", limit)
    return [Transition(i, "→ wiped") for i in leases_wipe(due, now=now)]


def sweep_snapshots(now: datetime, limit: int = BATCH) -> list[Transition]:
    """A move whose copy is not ready within MIGRATION_SNAPSHOT_WAIT_MINUTES goes
    ahead with the latest snapshot; a snapshot attempt without progress for
    SNAPSHOT_STALLED_MINUTES has failed (the next attempt follows, or the snapshot fails)."""
    from .failover import migration_snapshots_overdue
    from .storage import snapshot_attempt_failed, snapshot_attempts_stalled

    done = []
    for snap in migration_snapshots_overdue(now=now, limit=limit):
        if snapshot_attempt_failed(snapshot_id=snap.pk, op_id=snap.op_id, code="migration_wait_over", final=True,
                                   detail=f"not ready within {settings.MIGRATION_SNAPSHOT_WAIT_MINUTES} minutes",
                                   now=now):
            done.append(Transition(snap.source_lease_id, f"snapshot #{snap.pk}: move goes ahead without it"))
    for snap in snapshot_attempts_stalled(now=now, limit=limit):
        if snapshot_attempt_failed(snapshot_id=snap.pk, op_id=snap.op_id, code="snapshot_timed_out", now=now,
                                   detail=f"no progress reported for {settings.SNAPSHOT_STALLED_MINUTES} minutes "
                                          f"(attempt {snap.attempt})"):
            done.append(Transition(snap.source_lease_id, f"snapshot #{snap.pk} attempt {snap.attempt} timed out"))
    return done
