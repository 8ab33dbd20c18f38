"""The lease's event log in plain words: event codes and stored reasons (kept in English
in the database, as the audit trail) are shown to customers as sentences in their
language; an unknown code falls back to its words, never to a blank."""
from django import template
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop

from rental.models import LeaseState

register = template.Library()

EVENT_TEXT = {
    "created": _("Order placed"),
    "paid": _("Payment received"),
    "provisioned": _("Instance ready for SSH"),
    "extended": _("Term extended"),
    "extended_by_operator": _("Term extended by the operator"),
    "renewal": _("Renewal paid"),
    "renewal_invoice": _("Renewal invoice issued"),
    "suspended": _("Instance stopped, GPUs held"),
    "resumed": _("Instance started again"),
    "released": _("GPUs released"),
    "cancelled": _("Lease cancelled"),
    "failed": _("Provisioning failed"),
    "provisioning_failed": _("Provisioning failed"),
    "key_destroy_requested": _("Disk key destruction started"),
    "key_destroyed": _("Disk encryption key destroyed"),
    "wiped": _("Local disk wiped"),
    "migrated": _("Moved to another server"),
    "copy_key_destroyed": _("Old server's copy of the disk: key destroyed"),
    "copy_wiped": _("Old server's copy of the disk: wiped"),
    "copy_wipe_failed": _("Old server's copy of the disk: wipe failed, server taken out of service"),
    "egress": _("Traffic recorded"),
    "volume_attached": _("Network volume attached"),
    "volume_detached": _("Network volume detached"),
    "snapshot_taken": _("Snapshot taken"),
    "snapshot_restored": _("Snapshot restored"),
    "snapshot_ready": _("Snapshot copied and ready"),
    "snapshot_key_destroyed": _("Snapshot deleted, its key destroyed"),
    "restore_from_snapshot": _("Disk to start from a snapshot"),
    "auto_renew_set": _("Auto-renew changed"),
    "connection_changed": _("New connection line"),
    "instance_restart": _("Restart requested"),
    "instance_stop": _("Stop requested"),
    "instance_start": _("Start requested"),
    "workbench_set": _("Image, variables and ports chosen"),
    "workbench_changed": _("Variables, secrets, ports or start command changed"),
}

# Reasons the services store; listed so that makemessages finds them and the page can
# translate the stored English text.
KNOWN_REASONS = [
    gettext_noop("order placed"), gettext_noop("paid"), gettext_noop("renewal paid"),
    gettext_noop("term ended unpaid"), gettext_noop("hold expired unpaid"),
    gettext_noop("refund within 1 hour"), gettext_noop("host agent reports SSH ready"),
    gettext_noop("local NVMe wiped"), gettext_noop("LUKS2 key destroyed by host agent"),
    gettext_noop("hardware failure"), gettext_noop("node failed: migrated by operator"),
    gettext_noop("detached"), gettext_noop("lease ended"), gettext_noop("volume unpaid"),
    gettext_noop("volume deleted"), gettext_noop("deleted by the customer"),
    gettext_noop("quote expired unpaid"), gettext_noop("order expired unpaid"),
    # per-lease auto-renew
    gettext_noop("auto-renew on"), gettext_noop("auto-renew off"), gettext_noop("auto-renew follows the account"),
    gettext_noop("refund within the refund window"),
    # the workbench (rental.workbench)
    gettext_noop("image, variables, secrets and ports chosen with the order"), gettext_noop("changed by the customer"),
]


@register.filter
def event_text(kind: str) -> str:
    return EVENT_TEXT.get(kind) or kind.replace("_", " ").capitalize()


@register.filter
def state_label(state: str) -> str:
    """The state's label in the reader's language ('' stays '')."""
    return LeaseState(state).label if state in LeaseState.values else state


@register.filter
def event_reason(reason: str) -> str:
    from inventory.templatetags.stored_text import stored_text

    return stored_text(reason)
