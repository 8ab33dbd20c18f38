"""Every write of the fleet app outside reports: enrolment codes, enrolment, credential
revocation, and the customer's instance actions (restart, stop, start) — each audited
(inventory.AuditEntry for nodes, a LeaseEvent for leases)."""
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext as _

from inventory.audit import audit_record
from inventory.burnin import burn_in_gate_on, burn_in_request
from inventory.models import BurnIn, Node
from rental.models import Lease, LeaseState
from rental.services import lease_record
from rental.transitions import TransitionRefused

from .credentials import credentials_changed
from .crypto import new_secret, public_key_valid, secret_hash
from .models import EnrolmentCode, InstanceIntent, NodeAgent


class EnrolmentRefused(Exception):
    """Unknown, used or expired code (the agent gets 403 enrolment_refused)."""


def enrolment_code_create(*, node: Node, actor, now: datetime) -> str:
    """A one-time code for `node`, returned once; only its hash is stored. Earlier unused
    codes of the node stop working."""
    with transaction.atomic():
        code = new_secret()
        EnrolmentCode.objects.filter(node=node, used_at__isnull=True).update(expires_at=now)
        EnrolmentCode.objects.create(node=node, code_hash=secret_hash(code), created_at=now,
                                     expires_at=now + settings.NODE_ENROLMENT_CODE_TTL,
                                     created_by=actor if getattr(actor, "pk", None) else None)
        audit_record(actor=actor, action="node_enrolment_code", obj=node,
                     detail={"expires_at": (now + settings.NODE_ENROLMENT_CODE_TTL).isoformat()})
        return code


@dataclass(frozen=True)
class Enrolment:
    node: Node
    credential: str


def node_enrol(*, code: str, public_key: str, agent_version: str, hostname: str, now: datetime) -> Enrolment:
    """Exchange a valid code for a node credential (stored hashed) and register the
    agent's Ed25519 public key. Re-enrolment replaces both and restarts the seq count."""
    with transaction.atomic():
        if not public_key_valid(public_key):
            raise ValueError("public_key is not a base64 raw Ed25519 key")
        row = (EnrolmentCode.objects.select_for_update().select_related("node")
               .filter(code_hash=secret_hash(code), used_at__isnull=True, expires_at__gt=now).first())
        if row is None or not EnrolmentCode.objects.filter(pk=row.pk, used_at__isnull=True).update(used_at=now):
            raise EnrolmentRefused
        credential = new_secret()
        fields = {"credential_hash": secret_hash(credential), "public_key": public_key.strip(), "enrolled_at": now,
                  "revoked_at": None, "last_seq": 0, "seq_fence": 0, "agent_version": agent_version[:40], "hostname": hostname[:120]}
        NodeAgent.objects.update_or_create(node=row.node, defaults=fields)
        credentials_changed()
        audit_record(actor=None, action="node_enrolled", obj=row.node,
                     detail={"hostname": hostname[:120], "agent_version": agent_version[:40]})
        _burn_in_before_first_sale(row.node, now)
        return Enrolment(node=row.node, credential=credential)


def _burn_in_before_first_sale(node: Node, now: datetime) -> None:
    """From its agent's enrolment on, the node's cards are sold only after a burn-in;
    cards that never passed one are asked for it now (a re-enrolment keeps earlier passes)."""
    if not burn_in_gate_on():
        return
    Node.objects.filter(pk=node.pk).update(burn_in_required=True)
    for slot in node.slots.filter(burn_in_passed_at__isnull=True):
        burn_in_request(slot=slot, reason=BurnIn.Reason.FIRST_SALE, now=now)


def node_credential_revoke(*, node: Node, actor, now: datetime) -> bool:
    with transaction.atomic():
        changed = NodeAgent.objects.filter(node=node, credential_hash__isnull=False).update(
            credential_hash=None, revoked_at=now)
        if changed:
            credentials_changed()
            audit_record(actor=actor, action="node_credential_revoked", obj=node)
        return bool(changed)


def node_for_credential(credential: str) -> NodeAgent | None:
    if not credential or len(credential) > 200:
        return None
    return (NodeAgent.objects.select_related("node").filter(credential_hash=secret_hash(credential),
                                                            revoked_at__isnull=True).first())


# --- the customer's instance actions ------------------------------------------------------

def _intent(lease: Lease, now: datetime) -> InstanceIntent:
    InstanceIntent.objects.get_or_create(lease=lease, defaults={"changed_at": now})
    return InstanceIntent.objects.select_for_update().get(lease=lease)


def _locked_active(lease_id: int, customer) -> Lease:
    lease = Lease.objects.select_for_update().get(pk=lease_id, customer=customer)
    if lease.state != LeaseState.ACTIVE:
        raise TransitionRefused(_("Lease #%(id)s is %(state)s: its instance cannot be changed now.")
                               % {"id": lease.pk, "state": lease.get_state_display()})
    return lease


def instance_restart(*, lease_id: int, customer, now: datetime) -> None:
    """A new op_id for the running instance: the node agent restarts it (files kept)."""
    with transaction.atomic():
        lease = _locked_active(lease_id, customer)
        intent = _intent(lease, now)
        if intent.stopped_by_customer:
            raise TransitionRefused(_("The instance is stopped: start it instead."))
        InstanceIntent.objects.filter(pk=intent.pk).update(restarts=intent.restarts + 1, changed_at=now)
        lease_record(lease_id=lease.pk, kind="instance_restart", now=now, actor=customer,
                     reason="restart requested by the customer", data={"restart": intent.restarts + 1})


def instance_stop(*, lease_id: int, customer, now: datetime) -> None:
    """The customer stops the instance (files kept, the term keeps running)."""
    with transaction.atomic():
        lease = _locked_active(lease_id, customer)
        intent = _intent(lease, now)
        if intent.stopped_by_customer:
            return
        InstanceIntent.objects.filter(pk=intent.pk).update(stopped_by_customer=True, changed_at=now)
        lease_record(lease_id=lease.pk, kind="instance_stop", now=now, actor=customer,
                     reason="stopped by the customer")


def instance_start(*, lease_id: int, customer, now: datetime) -> None:
    from rental.storage import restore_into_pending

    with transaction.atomic():
        lease = _locked_active(lease_id, customer)
        intent = _intent(lease, now)
        if not intent.stopped_by_customer:
            return
        if restore_into_pending(lease) is not None:
            raise TransitionRefused(_("A snapshot is being restored onto this disk: start the instance once it is "
                                      "done."))
        InstanceIntent.objects.filter(pk=intent.pk).update(stopped_by_customer=False, changed_at=now)
        lease_record(lease_id=lease.pk, kind="instance_start", now=now, actor=customer,
                     reason="started by the customer")


def instance_restore(*, lease_id: int, customer, snapshot_id: int, now: datetime):
    """Restore one of the customer's snapshots into this existing lease's disk,
    replacing what it holds, while the instance is stopped (stopped by the customer, or the
    lease suspended); its node restores it on its next poll. Raises TransitionRefused."""
    from rental.models import Snapshot
    from rental.storage import StorageRefused, lease_restore_into

    with transaction.atomic():
        lease = Lease.objects.select_for_update().get(pk=lease_id, customer=customer)
        snapshot = Snapshot.objects.filter(pk=snapshot_id, customer=customer).first()
        if snapshot is None:
            raise TransitionRefused(_("That snapshot is not yours."))
        if lease.state == LeaseState.ACTIVE:
            if not _intent(lease, now).stopped_by_customer:
                raise TransitionRefused(_("Stop the instance first: a snapshot is restored onto a disk only while "
                                          "its instance is stopped."))
        elif lease.state != LeaseState.SUSPENDED:
            raise TransitionRefused(_("Lease #%(id)s is %(state)s: nothing can be restored into it.")
                                    % {"id": lease.pk, "state": lease.get_state_display()})
        try:
            return lease_restore_into(lease=lease, snapshot=snapshot, now=now, actor=customer)
        except StorageRefused as exc:
            raise TransitionRefused(str(exc)) from exc
