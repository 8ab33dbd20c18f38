"""Issue 30: the instance actions (restart, stop, start) in the JSON API, the same services
as the lease page's buttons (fleet.customer_views); plumbing from rental.api."""
from django.http import Http404, JsonResponse
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext as _

from rental.api import ApiError, api_endpoint, customer_lease, lease_json
from rental.services import TransitionRefused

from .customer_views import ACTIONS


@api_endpoint("POST", scope="order")
def instance_action(request, lease_id: int, action: str):
    if action not in ACTIONS:
        raise Http404
    lease = customer_lease(request, lease_id)
    service, done = ACTIONS[action]
    try:
        service(lease_id=lease.pk, customer=request.api_user, now=timezone.now())
    except TransitionRefused as exc:
        raise ApiError(409, "refused", str(exc)) from exc
    lease.refresh_from_db()
    return JsonResponse({"action": action, "message": _(done), "lease": lease_json(lease)}, status=202)


# Mounted by the root URLconf at /api/v1/leases/<id>/ (by name: nothing below fleet imports it).
urlpatterns = [path("<str:action>", instance_action, name="api_instance_action")]
