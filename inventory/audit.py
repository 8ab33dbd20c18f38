"""The audit trail every service writes (one row per state change, whoever made it).
Its own module so that every inventory module, and every app above, can import it without
importing the inventory services."""
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from django.utils import timezone

from .models import AuditEntry

#: (account id, member) while a customer's request acts for an account (rental.teams.rights).
_acting: ContextVar[tuple[int, object] | None] = ContextVar("acting_member", default=None)


@contextmanager
def acting_member(*, account_id: int, member):
    """While a member acts for an account, the audit rows that name the account as actor
    name the member instead: services are called with the account (whose objects they
    check and change), and the trail must say which person of the team acted."""
    token = _acting.set((account_id, member))
    try:
        yield
    finally:
        _acting.reset(token)


def audit_actor(actor):
    """The actor to record: the acting member in place of the account they act for."""
    acting = _acting.get()
    if acting is not None and getattr(actor, "pk", None) == acting[0]:
        return acting[1]
    return actor


def audit_record(*, actor, action: str, obj, detail: dict | None = None, at: datetime | None = None) -> AuditEntry:
    return AuditEntry.objects.create(
        at=at or timezone.now(),
        actor=audit_actor(actor) if getattr(actor, "pk", None) else None,
        action=action,
        object_type=obj._meta.label,
        object_id=str(obj.pk),
        detail=detail or {},
    )
