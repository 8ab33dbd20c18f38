"""The instance actions (restart, stop, start) in the JSON API, the same services
as the lease page's buttons (fleet.instances.views); plumbing from rental.api."""
from django.http import Http404, JsonResponse
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext as _

from rental.api import ApiError, api_endpoint, customer_lease, json_body, lease_json, token_scopes
from rental.transitions import TransitionRefused

from .instances.views import ACTIONS
from .telemetry_api import lease_metrics
from .workbench_api import lease_workbench


@api_endpoint("POST", scope="manage", right="operate")
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
    return JsonResponse({"action": action, "message": _(done), "lease": lease_json(lease, scopes=token_scopes(request))}, status=202)


@api_endpoint("POST", scope="manage", right="operate")
def instance_restore_api(request, lease_id: int):
    """{"snapshot": <id>} replaces the stopped lease's disk with the snapshot."""
    from .services import instance_restore

    lease = customer_lease(request, lease_id)
    snapshot_id = json_body(request).get("snapshot")
    if type(snapshot_id) is not int:
        raise ApiError(400, "invalid", _("“snapshot” must be the id of one of your snapshots."))
    try:
        event = instance_restore(lease_id=lease.pk, customer=request.api_user, snapshot_id=snapshot_id,
                                 now=timezone.now())
    except TransitionRefused as exc:
        raise ApiError(409, "refused", str(exc)) from exc
    lease.refresh_from_db()
    return JsonResponse({"action": "restore", "snapshot": snapshot_id, "op_id": f"restore:{lease.pk}:{event.pk}",
                         "message": _("The server replaces this disk's files with the snapshot; start the "
                                      "instance once it is done."), "lease": lease_json(lease, scopes=token_scopes(request))}, status=202)


# Mounted by the root URLconf at /api/v1/leases/<id>/ (by name: nothing below fleet imports it).
urlpatterns = [path("restore", instance_restore_api, name="api_instance_restore"),
               path("workbench", lease_workbench, name="api_lease_workbench"),
               path("metrics", lease_metrics, name="api_lease_metrics"),
               path("<str:action>", instance_action, name="api_instance_action")]
