"""The customer's instance actions from the lease page: restart, stop, start. They change
the node's desired state (fleet.services) and the node applies them on its next poll.
And the lease's signed sanitization record (fleet.records): JSON download, printable page,
API."""
import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from django.views.decorators.http import require_GET, require_POST

from rental.api import api_endpoint, customer_lease, error_response
from rental.models import Lease
from rental.teams.rights import customer_view
from rental.transitions import TransitionRefused

from ..records import proofs_unwiped, record_proofs, sanitization_record
from ..services import instance_restart, instance_restore, instance_start, instance_stop

ACTIONS = {
    "restart": (instance_restart, gettext_noop("Restart requested: the server restarts your instance within a minute.")),
    "stop": (instance_stop, gettext_noop("Stop requested: the server stops your instance; your files are kept.")),
    "start": (instance_start, gettext_noop("Start requested: the server starts your instance within a minute.")),
}


@customer_view("operate")
@login_required
@require_POST
def instance_action(request, lease_id: int, action: str):
    if action not in ACTIONS or not Lease.objects.filter(pk=lease_id, customer=request.account).exists():
        raise Http404
    service, done = ACTIONS[action]
    try:
        service(lease_id=lease_id, customer=request.account, now=timezone.now())
    except TransitionRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _(done))
    return redirect("lease_detail", lease_id=lease_id)


@customer_view("operate")
@login_required
@require_POST
def instance_restore_view(request, lease_id: int):
    """The lease page's "Restore a snapshot onto this disk" (a plain form; htmx
    swaps the page's live region with the page it redirects to)."""
    if not Lease.objects.filter(pk=lease_id, customer=request.account).exists():
        raise Http404
    try:
        snapshot_id = int(request.POST.get("snapshot", ""))
    except ValueError:
        snapshot_id = None
    if snapshot_id is None:
        messages.error(request, _("Choose a snapshot to restore."))
    elif request.POST.get("confirm") != "yes":
        messages.error(request, _("Tick the box to confirm that the snapshot replaces everything on this disk."))
    else:
        try:
            instance_restore(lease_id=lease_id, customer=request.account, snapshot_id=snapshot_id, now=timezone.now())
        except TransitionRefused as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, _("Restore requested: the server replaces this disk's files with snapshot "
                                        "#%(id)s; start the instance once it is done.") % {"id": snapshot_id})
    return redirect("lease_detail", lease_id=lease_id)


def _record_or_404(lease: Lease) -> dict:
    record = sanitization_record(lease, now=timezone.now())
    if record is None:
        raise Http404
    return record


def _json_attachment(record: dict, lease_id: int) -> HttpResponse:
    response = HttpResponse(json.dumps(record, indent=1, ensure_ascii=False), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="sanitization-record-lease-{lease_id}.json"'
    return response


@customer_view("view")
@login_required
@require_GET
def sanitization_record_download(request, lease_id: int):
    lease = get_object_or_404(Lease, pk=lease_id, customer=request.account)
    return _json_attachment(_record_or_404(lease), lease_id)


@customer_view("view")
@login_required
@require_GET
def sanitization_record_page(request, lease_id: int):
    """Printable: what was done to the disk, by which node, checked how; the signatures."""
    lease = get_object_or_404(Lease, pk=lease_id, customer=request.account)
    _record_or_404(lease)
    proofs = record_proofs(lease)
    return render(request, "fleet/sanitization_record.html",
                  {"lease": lease, "proofs": proofs, "unwiped": proofs_unwiped(proofs)})


@api_endpoint("GET", scope="read", right="view")
def sanitization_record_api(request, lease_id: int):
    record = sanitization_record(customer_lease(request, lease_id), now=timezone.now())
    if record is None:
        return error_response(404, "not_yet", _("No key destruction has been proven for this lease yet."))
    return _json_attachment(record, lease_id)
