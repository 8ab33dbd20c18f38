"""Suspension and release notices, through the outbox (rental.models.Notification, one row
per (lease, kind, deadline)): a sweep finds leases in those states without their notice and
sends it, so a notice goes out once however the lease got there (the lifecycle sweep, an
operator's action) and however often the sweep runs. Always in-app; e-mailed when the
customer gave an address (rental.services.notify)."""
from datetime import datetime

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils.translation import gettext as _

from . import rules
from .lifecycle import BATCH, DUE_LEASE_RELATED, Transition
from .models import Lease, LeaseEvent, LeaseState, Notification
from .notifications.notices import Notice, customer_language, notify_many

S = LeaseState
#: The reason billing suspends a running lease whose payment left its chain after it counted
#: (billing.payments.reversals): its term has not ended and no renewal invoice is due, so
#: its notice says what happened and what resumes it.
PAYMENT_REVERSED_REASON = "a payment for it was reversed on its chain and is not paid again"


def _missing(kind: str, deadline_field: str):
    return Notification.objects.filter(lease=OuterRef("pk"), kind=kind, deadline=OuterRef(deadline_field))


def _suspend_reasons(lease_ids: list[int]) -> dict[int, str]:
    """The reason of each lease's latest suspension (its notice depends on it)."""
    reasons: dict[int, str] = {}
    for lease_id, reason in (LeaseEvent.objects.filter(lease_id__in=lease_ids, kind="suspended")
                             .order_by("at", "pk").values_list("lease_id", "reason")):
        reasons[lease_id] = reason
    return reasons


def sweep_state_notices(now: datetime, limit: int = BATCH) -> list[Transition]:
    done, notices = [], []
    suspended = (Lease.objects.filter(state=S.SUSPENDED, hold_until__isnull=False)
                 .exclude(Exists(_missing("suspended", "hold_until")))
                 .select_related(*DUE_LEASE_RELATED).order_by("hold_until", "pk")[:limit])
    reasons = _suspend_reasons([lease.pk for lease in suspended])
    for lease in suspended:
        args = {"id": lease.pk, "offer": lease.offer, "end": f"{lease.ends_at:%Y-%m-%d %H:%M}",
                "hold": f"{lease.hold_until:%Y-%m-%d %H:%M}"}
        with customer_language(lease.customer):
            subject = _("Lease #%(id)s (%(offer)s) is suspended: pay by %(hold)s UTC") % args
            if reasons.get(lease.pk) == PAYMENT_REVERSED_REASON:
                body = _("A payment for lease #%(id)s left its chain after it counted (a reorganisation or a "
                         "double-spend), so it was taken back from your balance and is owed. The instance is "
                         "stopped; its GPU slot and disk are held until %(hold)s UTC. Topping up your balance by "
                         "what is owed before then resumes it. After that the slot is released and the disk key "
                         "is destroyed: data on the local NVMe cannot be recovered.") % args
            else:
                body = _("The term of lease #%(id)s ended unpaid at %(end)s UTC. The instance is stopped; its GPU "
                         "slot and disk are held until %(hold)s UTC. Paying the renewal invoice before then resumes "
                         "it. After that the slot is released and the disk key is destroyed: data on the local NVMe "
                         "cannot be recovered.") % args
        notices.append(Notice(lease=lease, kind="suspended", deadline=lease.hold_until, subject=subject, body=body))
    done += [Transition(n.lease.pk, "suspension notice") for n in notify_many(notices, now=now)]
    # Released within the wipe period (older ones are history), also when already wiped:
    # the wipe follows the key's destruction in the same pass.
    notices = []
    released = (Lease.objects.filter(state__in=[S.RELEASED, S.WIPED], hold_until__isnull=False,
                                     ended_at__gte=now - rules.wipe_within())
                .exclude(Exists(_missing("released", "ended_at")))
                .select_related(*DUE_LEASE_RELATED).order_by("ended_at", "pk")[:limit])
    for lease in released:
        args = {"id": lease.pk, "offer": lease.offer, "ended": f"{lease.ended_at:%Y-%m-%d %H:%M}",
                "wipe": f"{lease.wipe_by:%Y-%m-%d %H:%M}", "hold_hours": settings.LEASE_HOLD_HOURS}
        with customer_language(lease.customer):
            subject = _("Lease #%(id)s (%(offer)s) was released") % args
            body = _("Lease #%(id)s was released at %(ended)s UTC after its %(hold_hours)s-hour hold ended unpaid. "
                     "Its GPU slot is back in stock and the disk encryption key is destroyed; the local NVMe is "
                     "wiped by %(wipe)s UTC. Network volumes and snapshots are kept.") % args
        notices.append(Notice(lease=lease, kind="released", deadline=lease.ended_at, subject=subject, body=body))
    done += [Transition(n.lease.pk, "release notice") for n in notify_many(notices, now=now)]
    return done
