"""Every write in the rental domain. Each lease transition is one guarded update
(`UPDATE … WHERE id = ? AND state IN (…) [AND deadline condition]`) that writes a
LeaseEvent when, and only when, it changed the row; side effects run on commit. So a
sweep run twice, two beats at once or a payment racing a sweep all end in one result.
The guarded update itself is rental/transitions.py; a lease's disk key, rental/disk_keys.py."""
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from inventory.models import Offer, Site
from inventory.services import slots_allocate, slots_release, slots_release_many

from . import rules
from .accounts.services import (  # noqa: F401 - account_create and the settings rows, re-exported
    _loaded_settings,
    account_create,
    customer_settings,
    customer_settings_update,
)
from .addresses import ssh_command
from .agent import Instance, get_agent
from .disk_keys import disk_key_request_destroy, disk_keys_request_destroy
from .events import event_record as _event
from .models import (
    ENDED_ON_HOST,
    LIVE_STATES,
    TERM_LENGTH,
    CustomerSettings,
    DiskKey,
    Image,
    Lease,
    LeaseEvent,
    LeaseState,
    Term,
)
from .notifications.notices import customer_language, notify  # noqa: F401 - re-exported (billing calls them)
from .transitions import TransitionRefused, _transition, _transition_many

log = logging.getLogger(__name__)
S = LeaseState


# --- ordering -------------------------------------------------------------------------

@transaction.atomic
def lease_create_pending(*, customer: User, offer: Offer, site: Site, term: str, image: Image, ssh_public_key: str,
                         extra_nvme_tb: int = 0, network_volume_tb: int = 0,
                         price_cents: int, pay_window: timedelta, now: datetime,
                         ordered_from: str | None = None) -> Lease:
    """A pending lease that holds its GPU slots until `pay_by`. Raises inventory's SoldOut."""
    lease = Lease.objects.create(ordered_from=ordered_from or None,
        customer=customer, offer=offer, site=site, term=Term(term), image=image,
        ssh_public_key=ssh_public_key.strip(), extra_nvme_tb=extra_nvme_tb,
        network_volume_tb=network_volume_tb, price_cents=price_cents,
        pay_by=now + pay_window, created_at=now,
    )
    slots = slots_allocate(offer=offer, site=site, lease_id=lease.pk)
    DiskKey.objects.create(lease=lease)
    _event(lease.pk, kind="created", now=now, actor=customer, to_state=S.PENDING,
           reason="order placed", data={"slots": [s.pk for s in slots], "pay_by": lease.pay_by.isoformat()})
    return lease


@transaction.atomic
def lease_start_term(*, lease_id: int, now: datetime, actor=None, reason="paid") -> bool:
    """pending → provisioning. The first term starts when the instance is ready (see
    `lease_provisioned`), so an order paid while provisioning is late loses no paid time."""
    lease = Lease.objects.get(pk=lease_id)
    left = _transition(lease_id, to=S.PROVISIONING, from_states=[S.PENDING], now=now, kind="paid", actor=actor,
                       reason=reason, provisioning_started_at=now)
    if left:
        node = lease_node_name(lease_id)
        key_ref = DiskKey.objects.get(lease_id=lease_id).key_ref
        transaction.on_commit(lambda: get_agent().start_provisioning(
            lease_id=lease_id, node=node, ssh_public_key=lease.ssh_public_key, key_ref=key_ref))
    return bool(left)


def lease_node_name(lease_id: int) -> str:
    from inventory.models import SlotAllocation

    alloc = SlotAllocation.objects.filter(lease_id=lease_id).select_related("slot__node").first()
    return alloc.slot.node.name if alloc else ""


@transaction.atomic
def lease_provisioned(*, lease_id: int, instance: Instance, now: datetime) -> bool:
    """provisioning → active; the first term starts now."""
    term = Lease.objects.get(pk=lease_id).term_length
    left = _transition(lease_id, to=S.ACTIVE, from_states=[S.PROVISIONING], now=now, kind="provisioned",
                       reason="host agent reports SSH ready", host=instance.host, ssh_port=instance.ssh_port,
                       started_at=now, ends_at=now + term, data={"host": instance.host, "port": instance.ssh_port,
                                                                 **_node_key(instance)})
    if left:
        from .notifications.services import lease_event_emit

        lease_event_emit(event="instance.ready", lease=Lease.objects.select_related("customer").get(pk=lease_id),
                         at=now, now=now)
    return bool(left)


@transaction.atomic
def lease_extend(*, lease_id: int, term_start: datetime, now: datetime, actor=None, reason="renewal paid") -> bool:
    """A renewal for the term starting at `term_start` was paid: the new term runs from the
    old end. Resumes a suspended lease. Guarded on ends_at == term_start, so each renewal
    extends once. Returns False when the lease can no longer be extended (released). One
    lease of `leases_extend`."""
    return lease_id in leases_extend({lease_id: term_start}, now=now, actor=actor, reasons={lease_id: reason})


@transaction.atomic
def leases_extend(term_starts: dict[int, datetime], *, now: datetime, actor=None,
                  reasons: dict[int, str]) -> set[int]:
    """`lease_extend` for a batch of paid renewals ({lease id: the paid term's start}): the
    leases extended."""
    if not term_starts:
        return set()
    when = Q()
    for lease_id, term_start in term_starts.items():
        when |= Q(pk=lease_id, ends_at=term_start)

    def new_end(row):
        return term_starts[row["pk"]] + TERM_LENGTH[Term(row["term"])]

    left = _transition_many(term_starts, to=S.ACTIVE, from_states=[S.ACTIVE, S.SUSPENDED], now=now, kind="extended",
                            actor=actor, reason=lambda row: reasons[row["pk"]], when=when, read=("term",),
                            change=lambda row: {"ends_at": new_end(row), "suspended_at": None, "hold_until": None,
                                                "wipe_by": None},
                            data=lambda row, change: {"term_start": term_starts[row["pk"]].isoformat(),
                                                      "ends_at": change["ends_at"].isoformat()})
    resumed = [lease_id for lease_id, state in left.items() if state == S.SUSPENDED]
    if resumed:
        transaction.on_commit(lambda: _agent_each("resume", resumed))
    extended = set(left)
    for lease_id in set(term_starts) - extended:  # a provisioning lease keeps its state while its end moves
        if _provisioning_extend(lease_id, term_starts[lease_id], now=now, actor=actor, reason=reasons[lease_id]):
            extended.add(lease_id)
    return extended


def _provisioning_extend(lease_id: int, term_start: datetime, *, now: datetime, actor, reason: str) -> bool:
    lease = Lease.objects.filter(pk=lease_id, state=S.PROVISIONING, ends_at=term_start).first()
    if lease is None:
        return False
    new_end = term_start + lease.term_length
    changed = Lease.objects.filter(pk=lease_id, state=S.PROVISIONING, ends_at=term_start).update(ends_at=new_end)
    if changed:
        _event(lease_id, kind="extended", now=now, actor=actor, from_state=S.PROVISIONING,
               to_state=S.PROVISIONING, reason=reason, data={"ends_at": new_end.isoformat()})
    return bool(changed)


def _agent_each(action: str, lease_ids) -> None:
    """The host agent's `action` (stop, resume) for each lease, after the batch committed."""
    agent = get_agent()
    for lease_id in lease_ids:
        getattr(agent, action)(lease_id=lease_id)


@transaction.atomic
def lease_suspend(*, lease_id: int, now: datetime, actor=None, reason="term ended unpaid", force=False) -> bool:
    """active → suspended at term end: instance stopped, slot held for the hold
    (LEASE_HOLD_HOURS), disk untouched. The hold counts from this moment, the one the
    instance is actually stopped, so a late sweep never shortens it; an operator's
    mid-term suspend counts it from the term's end (a paid term is never cut short).
    One lease of `leases_suspend`."""
    return lease_id in leases_suspend([lease_id], now=now, actor=actor, reason=reason, force=force)


@transaction.atomic
def leases_suspend(lease_ids, *, now: datetime, actor=None, reason="term ended unpaid", force=False) -> list[int]:
    """`lease_suspend` for a batch (the suspend sweep's): the leases suspended. Only an active
    lease has an end to count the hold from."""
    def hold(row):
        held_from = rules.held_from(stopped_at=now, ends_at=row["ends_at"])
        return {"suspended_at": now, "hold_until": held_from + rules.hold(), "wipe_by": held_from + rules.wipe_within()}

    left = list(_transition_many(lease_ids, to=S.SUSPENDED, from_states=[S.ACTIVE], now=now, kind="suspended",
                                 actor=actor, reason=reason, when=None if force else Q(ends_at__lte=now),
                                 read=("ends_at",), change=hold,
                                 data=lambda row, change: {"hold_until": change["hold_until"].isoformat()}))
    if left:
        transaction.on_commit(lambda: _agent_each("stop", left))
    return left


@transaction.atomic
def lease_resume(*, lease_id: int, now: datetime, actor, reason: str) -> bool:
    """Operator resume of a suspended lease whose term is still running (e.g. a manual suspend)."""
    left = _transition(lease_id, to=S.ACTIVE, from_states=[S.SUSPENDED], now=now, kind="resumed", actor=actor,
                       reason=reason, when=Q(ends_at__gt=now), suspended_at=None, hold_until=None, wipe_by=None)
    if left:
        transaction.on_commit(lambda: get_agent().resume(lease_id=lease_id))
    return bool(left)


@transaction.atomic
def lease_release(*, lease_id: int, now: datetime, actor=None, reason="hold expired unpaid", force=False) -> bool:
    """suspended → released after the hold: slots back to stock, NVMe key destroyed. One
    lease of `leases_release`."""
    return lease_id in leases_release([lease_id], now=now, actor=actor, reason=reason, force=force)


@transaction.atomic
def leases_release(lease_ids, *, now: datetime, actor=None, reason="hold expired unpaid",
                   force=False) -> list[int]:
    """`lease_release` for a batch (the release sweep's): the leases released."""
    left = list(_transition_many(lease_ids, to=S.RELEASED, from_states=[S.SUSPENDED], now=now, kind="released",
                                 actor=actor, reason=reason, when=None if force else Q(hold_until__lte=now),
                                 change={"ended_at": now}))
    if not left:
        return []
    slots_release_many(lease_ids=left, now=now)
    _volumes_let_go(left, now=now, reason="lease ended")
    disk_keys_request_destroy(lease_ids=left, now=now, actor=actor, reason=reason)
    return left


def _volumes_let_go(lease_ids, *, now: datetime, reason: str) -> None:
    from .storage import leases_volumes_detach  # rental.storage imports this module

    leases_volumes_detach(lease_ids=[lease_ids] if isinstance(lease_ids, int) else lease_ids, now=now,
                          reason=reason)


@transaction.atomic
def lease_cancel(*, lease_id: int, now: datetime, from_states, actor=None, reason: str) -> bool:
    """pending → cancelled (payment window over) or provisioning/active → cancelled (refund)."""
    left = _transition(lease_id, to=S.CANCELLED, from_states=from_states, now=now, kind="cancelled", actor=actor,
                       reason=reason, ended_at=now, wipe_by=now)
    if not left:
        return False
    slots_release(lease_id=lease_id, now=now)
    _volumes_let_go(lease_id, now=now, reason="lease ended")
    disk_key_request_destroy(lease_id=lease_id, now=now, actor=actor, reason=reason)
    if left != S.PENDING:
        transaction.on_commit(lambda: get_agent().stop(lease_id=lease_id))
    return True


@transaction.atomic
def lease_fail(*, lease_id: int, now: datetime, reason: str) -> bool:
    """provisioning → failed when no instance came up within NODE_PROVISIONING_DEADLINE:
    slots back to stock, the disk key destroyed and the disk wiped like any ended lease.
    The refund and the notice are billing's (ops.lifecycle.sweep_provisioning_deadline)."""
    deadline = now - settings.NODE_PROVISIONING_DEADLINE
    left = _transition(lease_id, to=S.FAILED, from_states=[S.PROVISIONING], now=now, kind="provisioning_failed",
                       reason=reason, when=Q(provisioning_started_at__lte=deadline), ended_at=now, wipe_by=now,
                       data={"deadline_minutes": int(settings.NODE_PROVISIONING_DEADLINE.total_seconds() // 60)})
    if not left:
        return False
    slots_release(lease_id=lease_id)
    _volumes_let_go(lease_id, now=now, reason="lease ended")
    disk_key_request_destroy(lease_id=lease_id, now=now, reason=reason)
    transaction.on_commit(lambda: get_agent().stop(lease_id=lease_id))
    return True


@transaction.atomic
def lease_connection_update(*, lease_id: int, instance: Instance, now: datetime, reason: str) -> bool:
    """A running lease's instance answers at a new address (it moved to another node):
    the connection line changes, with an event and a notice that gives the new one."""
    lease = Lease.objects.select_for_update().select_related("customer").get(pk=lease_id)
    if lease.state not in (S.ACTIVE, S.SUSPENDED) or (lease.host, lease.ssh_port) == (instance.host,
                                                                                        instance.ssh_port):
        keys = lease.node_key_fingerprints()
        if lease.state in (S.ACTIVE, S.SUSPENDED) and instance.node_key_fingerprint and \
                keys[-1:] != [instance.node_key_fingerprint]:
            _event(lease_id, kind="node_key", now=now, from_state=lease.state, to_state=lease.state,
                   reason=reason, data=_node_key(instance))     # same address, another node
        return False
    Lease.objects.filter(pk=lease_id).update(host=instance.host, ssh_port=instance.ssh_port)
    _event(lease_id, kind="connection_changed", now=now, from_state=lease.state, to_state=lease.state,
           reason=reason, data={"old": f"{lease.host}:{lease.ssh_port}", "host": instance.host,
                                "port": instance.ssh_port, **_node_key(instance)})
    args = {"id": lease.pk, "command": ssh_command(instance.host, instance.ssh_port)}
    with customer_language(lease.customer):
        subject = _("Lease #%(id)s: new connection details") % args
        body = _("The instance of lease #%(id)s answers at a new address (it moved to another server). "
                 "Connect with: %(command)s") % args
    notify(lease=lease, kind="connection_changed", deadline=now, subject=subject, body=body)
    return True


def _node_key(instance: Instance) -> dict:
    return {"node_key_fingerprint": instance.node_key_fingerprint} if instance.node_key_fingerprint else {}


def lease_record(*, lease_id: int, kind: str, now: datetime, actor=None, reason: str = "", data=None) -> LeaseEvent:
    """An event that changes no state (a customer's restart, stop or start of the instance)."""
    state = Lease.objects.filter(pk=lease_id).values_list("state", flat=True).get()
    return _event(lease_id, kind=kind, now=now, actor=actor, from_state=state, to_state=state, reason=reason,
                  data=data)


@transaction.atomic
def lease_wipe(*, lease_id: int, now: datetime) -> bool:
    """released/cancelled/failed → wiped as soon as the key is destroyed (wipe_by is only the
    deadline alerts watch) and the host agent proved the wipe; without a proof yet, False
    (next pass). One lease of `leases_wipe`."""
    return lease_id in leases_wipe([lease_id], now=now)


@transaction.atomic
def leases_wipe(lease_ids, *, now: datetime) -> list[int]:
    """`lease_wipe` for a batch (the wipe sweep's): the leases wiped. The lease rows stay
    locked from this check to the update (SQLite: the write lock), so two overlapping passes
    never ask the host to wipe the same disk twice."""
    leases = (Lease.objects.select_for_update(of=("self",)).select_related("disk_key")
              .filter(pk__in=list(lease_ids), state__in=ENDED_ON_HOST).order_by("pk"))
    agent, receipts = get_agent(), {}
    for lease in leases:
        if lease.disk_key.state != DiskKey.State.DESTROYED:
            continue
        receipt = agent.wipe(lease_id=lease.pk, at=now)
        if receipt is not None:
            receipts[lease.pk] = receipt
    if not receipts:
        return []
    return list(_transition_many(receipts, to=S.WIPED, from_states=ENDED_ON_HOST, now=now, kind="wiped",
                                 reason="local NVMe wiped", data=lambda row, _: {"receipt": receipts[row["pk"]]}))


# --- notifications ----------------------------------------------------------------------

# --- operator actions (admin, management commands) --------------------------------------

@transaction.atomic
def lease_extend_by_operator(*, lease_id: int, actor, reason: str, now: datetime) -> bool:
    """One more term free of charge, from the current end. Guarded like `lease_extend`:
    the update only applies while `ends_at` is still the end the operator extended, so a
    renewal payment landing at the same moment is not swallowed (one of them wins, the
    other returns False / goes to the balance). A suspended lease whose new end is in the
    future is resumed. Returns False when the lease moved in between."""
    if not reason.strip():
        raise TransitionRefused(_("An operator extension needs a reason."))
    lease = Lease.objects.get(pk=lease_id)
    if lease.state not in (S.PROVISIONING, S.ACTIVE, S.SUSPENDED) or lease.ends_at is None:
        raise TransitionRefused(_("Lease #%(id)s is %(state)s: it has no term to extend.")
                               % {"id": lease_id, "state": lease.get_state_display()})
    old_end = lease.ends_at
    new_end = old_end + lease.term_length
    data = {"term_start": old_end.isoformat(), "ends_at": new_end.isoformat(), "free_of_charge": True}
    if lease.state == S.PROVISIONING:
        changed = Lease.objects.filter(pk=lease_id, state=S.PROVISIONING, ends_at=old_end).update(ends_at=new_end)
        if changed:
            _event(lease_id, kind="extended_by_operator", now=now, actor=actor, from_state=S.PROVISIONING,
                   to_state=S.PROVISIONING, reason=reason, data=data)
        return bool(changed)
    if new_end <= now:
        raise TransitionRefused(_("Lease #%(id)s: one more term would still end in the past.") % {"id": lease_id})
    left = _transition(lease_id, to=S.ACTIVE, from_states=[lease.state], now=now, kind="extended_by_operator",
                       actor=actor, reason=reason, when=Q(ends_at=old_end), ends_at=new_end, suspended_at=None,
                       hold_until=None, wipe_by=None, data=data)
    if left == S.SUSPENDED:
        transaction.on_commit(lambda: get_agent().resume(lease_id=lease_id))
    return bool(left)


# --- Per-lease auto-renew -------------------------------------------------------

def lease_auto_renews(lease, *, account_default: bool | None = None) -> bool:
    """Whether this lease's renewal is paid from the balance: its own choice, else the
    account-wide default (the settings page's checkbox; pass it when listing many leases)."""
    if lease.auto_renew is not None:
        return lease.auto_renew
    if account_default is None and Lease.customer.is_cached(lease):  # read with the lease (the sweeps)
        loaded = _loaded_settings(lease.customer)
        account_default = loaded.auto_renew if loaded else None
    return account_auto_renew(lease.customer_id) if account_default is None else account_default


def account_auto_renew(customer_id: int) -> bool:
    default = CustomerSettings.objects.filter(user_id=customer_id).values_list("auto_renew", flat=True).first()
    return True if default is None else default


@transaction.atomic
def lease_auto_renew_set(*, customer: User, lease_id: int, auto_renew: bool | None,
                         now: datetime | None = None) -> bool:
    """Sets (True/False) or clears (None: follow the account) a lease's auto-renew; audited
    as a lease event. False when the lease is not the customer's or has ended."""
    lease = Lease.objects.select_for_update().filter(pk=lease_id, customer=customer, state__in=LIVE_STATES).first()
    if lease is None:
        return False
    if lease.auto_renew != auto_renew:
        Lease.objects.filter(pk=lease.pk).update(auto_renew=auto_renew)
        lease_record(lease_id=lease.pk, kind="auto_renew_set", now=now or timezone.now(), actor=customer,
                     reason="auto-renew " + {True: "on", False: "off", None: "follows the account"}[auto_renew],
                     data={"auto_renew": auto_renew})
    return True
