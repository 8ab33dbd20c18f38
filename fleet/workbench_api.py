"""A lease's workbench in the JSON API: GET its image, variables (secrets by name only) and
ports with what the node running it reports (pull progress, a named failure, each port's
public address); PATCH changes variables, secrets, ports or the start command through
rental.workbench (the node recreates the container, the disk kept). Mounted with the other
instance routes at /api/v1/leases/<id>/workbench (fleet.api)."""
from django.http import JsonResponse
from django.utils import timezone

from rental.api import ApiError, api_endpoint, customer_lease, json_body
from rental.workbench import UNSET, WorkbenchChangeRefused, lease_workbench_change
from rental.workbench_api import refused, workbench_json
from rental.workbench_rules import WorkbenchRefused

from .templatetags.fleet_workbench import workbench_status


def _answer(lease, status: int = 200, changed=None) -> JsonResponse:
    live = workbench_status(lease) or {"pull": None, "error": None, "addresses": {}}
    body = {**workbench_json(lease), "pull": live["pull"], "error": live["error"],
            "addresses": {str(port): address for port, address in live["addresses"].items()}}
    if changed is not None:
        body["changed"] = changed
    return JsonResponse(body, status=status)


@api_endpoint("GET", "PATCH", scope={"GET": "read", "PATCH": "manage"}, right={"GET": "view", "PATCH": "operate"})
def lease_workbench(request, lease_id: int):
    """PATCH {"env": {"NAME": "value" | null}, "secrets": {"NAME": "value" | null},
    "ports": [{"port": 8888, "allow": [CIDR, …]}], "start_command": "…"}: each part optional;
    env and secrets are patches (null removes), ports replaces the list."""
    lease = customer_lease(request, lease_id)
    if request.method == "GET":
        return _answer(lease)
    data = json_body(request)
    unknown = sorted(set(data) - {"env", "secrets", "ports", "start_command"})
    if unknown:
        raise ApiError(400, "invalid", f"Unknown field(s): {', '.join(unknown)}.",
                       fields={name: ["Not a field of a lease's workbench."] for name in unknown})
    try:
        result = lease_workbench_change(
            lease_id=lease.pk, customer=request.api_user, now=timezone.now(), env=data.get("env"),
            secrets=data.get("secrets"), ports=data["ports"] if "ports" in data else UNSET,
            start_command=data["start_command"] if "start_command" in data else UNSET)
    except WorkbenchChangeRefused as exc:
        raise ApiError(409, "lease_ended", str(exc)) from exc
    except WorkbenchRefused as exc:
        raise refused(exc) from exc
    lease.refresh_from_db()
    return _answer(lease, changed=result["changed"])
