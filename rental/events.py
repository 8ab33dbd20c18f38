"""What happened to a lease, below the services that make it happen: the LeaseEvent row
every state change writes (`event_record`: rental.services, rental.storage, rental.failover,
storage) and the line a lifecycle sweep reports (`Transition`: rental.lifecycle,
billing's and the notifications' sweeps). Here so that none of them imports another to get
these."""
from dataclasses import dataclass
from datetime import datetime

from core.audit import audit_actor

from .models import LeaseEvent


@dataclass(frozen=True)
class Transition:
    lease_id: int | None  # None: not one lease's (billing's sweeps: a customer's debts paid again)
    what: str


def event_record(lease_id: int, *, kind: str, now: datetime, actor=None, from_state="", to_state="", reason="",
                 data=None) -> LeaseEvent:
    event = event_row(lease_id, kind=kind, now=now, actor=actor, from_state=from_state, to_state=to_state,
                      reason=reason, data=data)
    event.save()
    return event


def events_record(events: list[LeaseEvent]) -> list[LeaseEvent]:
    """Many unsaved LeaseEvents (a lifecycle batch's transitions) in one statement."""
    return LeaseEvent.objects.bulk_create(events)


def event_row(lease_id: int, *, kind: str, now: datetime, actor=None, from_state="", to_state="", reason="",
              data=None) -> LeaseEvent:
    """The unsaved LeaseEvent `event_record` writes (for `events_record`)."""
    return LeaseEvent(lease_id=lease_id, kind=kind, at=now,
                      actor=audit_actor(actor) if getattr(actor, "pk", None) else None,
                      from_state=from_state, to_state=to_state, reason=reason[:300], data=data or {})
