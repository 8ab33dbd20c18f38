"""Incidents: hardware that is down or degraded, from the operator (admin) or the host
agent's health check. Every write is here, audited.

Opening an incident takes the covered slots out of service (they leave stock at once) and
records a Downtime row for every lease holding one of them during the incident; closing it
ends that downtime and returns to service exactly the slots it took out, unless another
open incident still covers them. An incident entered after the fact (with an end) records
the downtime of the leases that held the slots then, and leaves the slots as they are.
"""
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .audit import audit_record
from .models import Downtime, GpuSlot, Incident, IncidentSlot, Node, Site, SlotAllocation
from .selectors import catalog_changed


class IncidentRefused(Exception):
    """The incident cannot be opened or closed as asked; the message says why."""


def _slots_in_scope(*, site: Site | None, node: Node | None, slot: GpuSlot | None):
    if slot is not None:
        return GpuSlot.objects.filter(pk=slot.pk)
    if node is not None:
        return GpuSlot.objects.filter(node=node)
    return GpuSlot.objects.filter(node__site=site)


@transaction.atomic
def incident_open(*, kind: str = Incident.Kind.DOWN, starts_at: datetime, reason: str, site: Site | None = None,
                  node: Node | None = None, slot: GpuSlot | None = None, ends_at: datetime | None = None,
                  actor=None, source: str = Incident.Source.OPERATOR, now: datetime | None = None) -> Incident:
    """Open (or, with `ends_at` in the past, record) an incident on exactly one of site, node
    or slot. A health check reporting the same open fault again gets the open incident back."""
    now = now or timezone.now()
    if sum(x is not None for x in (site, node, slot)) != 1:
        raise IncidentRefused("An incident covers exactly one site, node or GPU slot.")
    if not reason.strip():
        raise IncidentRefused("An incident needs a reason.")
    if ends_at is not None and ends_at < starts_at:
        raise IncidentRefused("An incident cannot end before it starts.")
    if starts_at > now:
        raise IncidentRefused("An incident cannot start in the future.")
    if source == Incident.Source.HEALTH_CHECK:
        same = Incident.objects.filter(site=site, node=node, slot=slot, kind=kind, ends_at__isnull=True).first()
        if same:
            return same
    incident = Incident.objects.create(site=site, node=node, slot=slot, kind=kind, source=source,
                                       starts_at=starts_at, ends_at=ends_at, reason=reason[:300],
                                       created_by=actor if getattr(actor, "pk", None) else None)
    slots = list(_slots_in_scope(site=site, node=node, slot=slot).select_for_update().order_by("pk"))
    still_running = ends_at is None or ends_at > now
    took_out = {s.pk for s in slots if s.in_service} if still_running else set()
    IncidentSlot.objects.bulk_create([
        IncidentSlot(incident=incident, slot=s, took_out_of_service=s.pk in took_out) for s in slots])
    if took_out:
        GpuSlot.objects.filter(pk__in=took_out).update(in_service=False)
        transaction.on_commit(catalog_changed)
    downtimes = _record_downtime(incident, [s.pk for s in slots])
    audit_record(actor=actor, action="incident_open", obj=incident,
                 detail={"scope": incident.scope_label, "kind": kind, "source": source, "reason": reason[:300],
                         "slots_out_of_service": len(took_out), "leases_affected": downtimes})
    return incident


def _record_downtime(incident: Incident, slot_ids: list[int]) -> int:
    """One Downtime per lease that held a covered slot during the incident, clipped to the
    time it held it."""
    allocs = SlotAllocation.objects.filter(slot_id__in=slot_ids).filter(
        Q(released_at__isnull=True) | Q(released_at__gt=incident.starts_at))
    if incident.ends_at is not None:
        allocs = allocs.filter(allocated_at__lt=incident.ends_at)
    spans: dict[int, tuple[datetime, datetime | None]] = {}
    for alloc in allocs:
        start = max(incident.starts_at, alloc.allocated_at)
        ends = [t for t in (incident.ends_at, alloc.released_at) if t is not None]
        end = min(ends) if ends else None
        if alloc.lease_id in spans:
            old_start, old_end = spans[alloc.lease_id]
            start = min(start, old_start)
            end = None if end is None or old_end is None else max(end, old_end)
        spans[alloc.lease_id] = (start, end)
    Downtime.objects.bulk_create([
        Downtime(lease_id=lease_id, incident=incident, kind=incident.kind, starts_at=start, ends_at=end)
        for lease_id, (start, end) in spans.items()
    ])
    return len(spans)


@transaction.atomic
def incident_close(*, incident: Incident, ends_at: datetime | None = None, actor=None, reason: str = "",
                   now: datetime | None = None) -> bool:
    """End an open incident: its downtime ends, the slots it took out return to service
    (those still covered by another open incident stay out). Returns False when it was
    already closed (a repeated health-check "healthy" is harmless)."""
    now = now or timezone.now()
    ends_at = ends_at or now
    incident = Incident.objects.select_for_update().get(pk=incident.pk)
    if incident.ends_at is not None:
        return False
    if ends_at < incident.starts_at:
        raise IncidentRefused("An incident cannot end before it starts.")
    Incident.objects.filter(pk=incident.pk, ends_at__isnull=True).update(
        ends_at=ends_at, closed_by=actor if getattr(actor, "pk", None) else None)
    Downtime.objects.filter(incident=incident, ends_at__isnull=True).update(ends_at=ends_at)
    # Downtime that began after the given end (an end entered after the fact) is empty.
    Downtime.objects.filter(incident=incident, starts_at__gt=ends_at).update(starts_at=ends_at)
    covered_ids = set(IncidentSlot.objects.filter(incident__ends_at__isnull=True, incident__starts_at__lte=now)
                      .values_list("slot_id", flat=True))
    mine = set(IncidentSlot.objects.filter(incident=incident).values_list("slot_id", flat=True))
    free_now = mine - covered_ids
    # Slots taken out by this or an earlier, already closed incident and not yet restored.
    pending = IncidentSlot.objects.filter(slot_id__in=free_now, took_out_of_service=True, restored_at__isnull=True,
                                          incident__ends_at__isnull=False)
    restore = set(pending.values_list("slot_id", flat=True))
    pending.update(restored_at=now)
    if GpuSlot.objects.filter(pk__in=restore).update(in_service=True):
        transaction.on_commit(catalog_changed)
    audit_record(actor=actor, action="incident_close", obj=incident,
                 detail={"ends_at": ends_at.isoformat(), "slots_back_in_service": len(restore), "reason": reason})
    return True


@transaction.atomic
def downtime_end_for_lease(*, lease_id: int, at: datetime) -> int:
    """The lease left the failed hardware (migrated): its open downtime ends now."""
    return Downtime.objects.filter(lease_id=lease_id, ends_at__isnull=True).update(ends_at=at)


# --- the host agent's health check ------------------------------------------------------

def health_report(*, node: Node, healthy: bool, at: datetime, slot_index: int | None = None,
                  detail: str = "") -> Incident | None:
    """What the host agent calls after each health check of a node (or one of its GPUs):
    unhealthy opens an incident (once), healthy closes the open health-check incident."""
    slot = GpuSlot.objects.get(node=node, index=slot_index) if slot_index is not None else None
    scope = {"node": None if slot else node, "slot": slot}
    if not healthy:
        return incident_open(kind=Incident.Kind.DOWN, starts_at=at, reason=detail or "health check failed",
                             source=Incident.Source.HEALTH_CHECK, now=max(at, timezone.now()), **scope)
    open_ = Incident.objects.filter(source=Incident.Source.HEALTH_CHECK, ends_at__isnull=True, **scope).first()
    if open_:
        incident_close(incident=open_, ends_at=at, reason=detail or "health check passed", now=max(at, timezone.now()))
    return open_
