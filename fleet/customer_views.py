"""The customer's instance actions from the lease page: restart, stop, start. They change
the node's desired state (fleet.services) and the node applies them on its next poll."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from django.views.decorators.http import require_POST

from rental.models import Lease
from rental.services import TransitionRefused

from .services import instance_restart, instance_start, instance_stop

ACTIONS = {
    "restart": (instance_restart, gettext_noop("Restart requested: the server restarts your instance within a minute.")),
    "stop": (instance_stop, gettext_noop("Stop requested: the server stops your instance; your files are kept.")),
    "start": (instance_start, gettext_noop("Start requested: the server starts your instance within a minute.")),
}


@login_required
@require_POST
def instance_action(request, lease_id: int, action: str):
    if action not in ACTIONS or not Lease.objects.filter(pk=lease_id, customer=request.user).exists():
        raise Http404
    service, done = ACTIONS[action]
    try:
        service(lease_id=lease_id, customer=request.user, now=timezone.now())
    except TransitionRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, _(done))
    return redirect("lease_detail", lease_id=lease_id)
