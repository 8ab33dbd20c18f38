"""The node's side of a lease's workbench for the lease page (rental templates cannot import
fleet): the image pull's progress, a pull's failure in plain words, and the public address of
each published port, from the node's last report (fleet/instance_reports.py)."""
from django import template
from django.conf import settings
from django.utils.translation import gettext as _

from rental.addresses import valid_host
from rental.models import Lease, LeaseState

from ..models import NodeAgent
from .fleet_tags import node_and_report

register = template.Library()


def image_error_text(code: str) -> str:
    """A node's named failure of the lease's image, for the customer ("" for other codes)."""
    texts = {
        "image_pulling": _("The server is pulling the image."),
        "image_not_found": _("The registry has no such image: check its name and tag (and, for a private "
                             "image, that the credential can read it)."),
        "image_too_large": _("The image is larger than the %(gb)d GB allowed (unpacked): choose a smaller one.")
        % {"gb": settings.WORKBENCH_IMAGE_MAX_GB},
        "image_no_shell": _("The image has no /bin/sh, which SSH and the start command need: use an image "
                            "based on a Linux distribution (Debian, Ubuntu, Alpine…)."),
        "registry_auth_failed": _("The registry refused the credential: check the user name and the password "
                                  "or token in your account's registry credentials."),
    }
    return texts.get(code, "")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@register.simple_tag
def workbench_status(lease: Lease) -> dict | None:
    """{pull: {done_bytes, total_bytes, percent}, error: {code, text, detail}, addresses:
    {container port: "host:port"}} as the node running the lease last reported; None when the
    lease is not on a node."""
    if lease.state not in (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED):
        return None
    node_id, report = node_and_report(lease)
    if node_id is None:
        return None
    if report is None:
        return {"pull": None, "error": None, "addresses": {}}
    host = valid_host(lease.host) or valid_host(
        NodeAgent.objects.filter(node_id=node_id).values_list("public_host", flat=True).first() or "")
    addresses = {int(port): _address(host, hp) for port, hp in (report.ports or {}).items()} if host else {}
    pull = None
    if report.pull:
        done, total = report.pull["done_bytes"], report.pull["total_bytes"]
        pull = {"done_bytes": done, "total_bytes": total,
                "percent": min(100, done * 100 // total) if total else None}
    error = None
    if report.error:
        error = {"code": report.error.get("code", ""), "text": image_error_text(report.error.get("code", "")),
                 "detail": report.error.get("detail", "")}
    return {"pull": pull, "error": error, "addresses": addresses}


@register.filter
def port_address(addresses, port) -> str:
    """The public address of a container port in workbench_status's `addresses` ("" : none yet)."""
    return (addresses or {}).get(port, "") if isinstance(addresses, dict) else ""
