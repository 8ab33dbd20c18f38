"""A lease's disk key, destroyed in two phases and refused while a term is paid (the
request, then the host's proof), and the proofs a node sends of what became of the copy of
a moved lease's disk (its key destroyed, its blocks wiped)."""
from datetime import datetime

from django.db import transaction
from django.utils.translation import gettext as _

from .agent import get_agent
from .events import event_record as _event
from .events import event_row as _event_row
from .events import events_record
from .models import ENDED_ON_HOST, DiskKey, Lease, LeaseState
from .transitions import TransitionRefused, _per_row_values

S = LeaseState


@transaction.atomic
def disk_key_request_destroy(*, lease_id: int, now: datetime, actor=None, reason: str) -> DiskKey:
    """One lease of `disk_keys_request_destroy`."""
    [key] = disk_keys_request_destroy(lease_ids=[lease_id], now=now, actor=actor, reason=reason)
    key.refresh_from_db()
    return key


@transaction.atomic
def disk_keys_request_destroy(*, lease_ids, now: datetime, actor=None, reason: str) -> list[DiskKey]:
    """Phase one for a batch of ended leases (refused, for all, while one has a paid term):
    the keys marked destroy-requested with an event each; phase two (the host) once the
    batch committed."""
    keys = list(DiskKey.objects.select_for_update().select_related("lease").filter(lease_id__in=list(lease_ids))
                .order_by("lease_id"))
    for key in keys:
        if key.lease.state not in (*ENDED_ON_HOST, S.WIPED):
            raise TransitionRefused(_("Lease #%(id)s is %(state)s: its key cannot be destroyed.")
                                    % {"id": key.lease_id, "state": key.lease.get_state_display()})
        if key.lease.state == S.RELEASED and key.lease.ends_at and key.lease.ends_at > now:
            raise TransitionRefused(_("Lease #%(id)s has a paid term until %(end)s UTC.")
                                    % {"id": key.lease_id, "end": f"{key.lease.ends_at:%Y-%m-%d %H:%M}"})
    active = [key for key in keys if key.state == DiskKey.State.ACTIVE]
    if active:
        DiskKey.objects.filter(pk__in=[key.pk for key in active], state=DiskKey.State.ACTIVE).update(
            state=DiskKey.State.DESTROY_REQUESTED, destroy_requested_at=now,
            destroy_requested_by=actor if getattr(actor, "pk", None) else None, destroy_reason=reason[:200])
        events_record([_event_row(key.lease_id, kind="key_destroy_requested", now=now, actor=actor, reason=reason)
                       for key in active])
    ids = [key.lease_id for key in keys]
    transaction.on_commit(lambda: disk_keys_complete_destroy(lease_ids=ids, now=now))
    return keys


@transaction.atomic
def disk_key_complete_destroy(*, lease_id: int, now: datetime) -> bool:
    """Phase two: the agent destroys the key and returns a receipt, stored as the proof
    (the node agent's signed key_destroyed evidence); None means not done yet. One lease of
    `disk_keys_complete_destroy`."""
    return lease_id in disk_keys_complete_destroy(lease_ids=[lease_id], now=now)


@transaction.atomic
def disk_keys_complete_destroy(*, lease_ids, now: datetime) -> list[int]:
    """Phase two for a batch: the leases whose key the host destroyed now (a key not
    requested, or not proven destroyed yet, stays for the sweep). The keys are locked from
    the check to the update, so two callers never ask the host twice."""
    from .notifications.services import Event, events_emit, lease_data, lease_term

    keys = (DiskKey.objects.select_for_update().filter(lease_id__in=list(lease_ids),
                                                       state=DiskKey.State.DESTROY_REQUESTED).order_by("lease_id"))
    agent, receipts = get_agent(), {}
    for key in keys:
        receipt = agent.destroy_key(lease_id=key.lease_id, key_ref=key.key_ref, at=now)
        if receipt is not None:  # the host has not proven it yet: stays requested, the sweep asks again
            receipts[key.pk] = (key.lease_id, receipt)
    if not receipts:
        return []
    DiskKey.objects.filter(pk__in=list(receipts)).update(
        state=DiskKey.State.DESTROYED, destroyed_at=now,
        **_per_row_values(DiskKey, {pk: {"destruction_proof": proof} for pk, (_, proof) in receipts.items()}))
    events_record([_event_row(lease_id, kind="key_destroyed", now=now, reason="LUKS2 key destroyed by host agent",
                              data={"receipt": receipt}) for lease_id, receipt in receipts.values()])
    proofs = dict(receipts.values())
    leases = Lease.objects.select_related("customer").filter(pk__in=list(proofs)).order_by("pk")
    events_emit([Event(event="key.destroyed", term=lease_term(lease, None), customer=lease.customer, lease=lease,
                       data=lambda lease=lease: {"lease": lease_data(lease), "key": {
                           "destroyed_at": now.isoformat(), "proof": proofs[lease.pk]}}) for lease in leases],
                now=now)
    return sorted(proofs)


#: The LeaseEvent kinds a node's proof about a moved lease's copy writes.
COPY_EVENTS = {("key_destroyed", True): "copy_key_destroyed", ("disk_wiped", True): "copy_wiped",
               ("disk_wiped", False): "copy_wipe_failed"}


@transaction.atomic
def lease_copy_sanitized(*, lease_id: int, node: str, kind: str, ok: bool, receipt: str, now: datetime):
    """A node the lease moved off proved what became of the copy of the disk it held: its
    LUKS2 key destroyed (`key_destroyed`) or its blocks wiped (`disk_wiped`, `ok` or failed).
    The lease's own disk, key and state are elsewhere and untouched; this is the audit row,
    with the node-signed receipt, that the lease's sanitization record and timeline show."""
    event_kind = COPY_EVENTS[(kind, ok)]
    what = {"copy_key_destroyed": "key destroyed", "copy_wiped": "wiped", "copy_wipe_failed": "wipe failed"}
    # inventory.templatetags.stored_text shows this reason in the reader's language
    return _event(lease_id, kind=event_kind, now=now, reason=f"disk copy {what[event_kind]} on node {node}",
                  data={"node": node, "receipt": receipt})
