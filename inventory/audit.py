"""The audit trail every service writes (one row per state change, whoever made it).
Its own module so that every inventory module, and every app above, can import it without
importing the inventory services. Beside its model (AuditEntry, an inventory table); who
acts for whom is core.audit's."""
from datetime import datetime

from django.utils import timezone

from core.audit import audit_actor

from .models import AuditEntry


def audit_record(*, actor, action: str, obj, detail: dict | None = None, at: datetime | None = None) -> AuditEntry:
    return AuditEntry.objects.create(
        at=at or timezone.now(),
        actor=audit_actor(actor) if getattr(actor, "pk", None) else None,
        action=action,
        object_type=obj._meta.label,
        object_id=str(obj.pk),
        detail=detail or {},
    )
