"""`GET /api/v1/leases/<id>/metrics`: the lease's GPU telemetry as JSON (docs/API.md), the
same figures as the lease page's charts, at the resolution asked; plumbing from rental.api."""
import re
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.http import JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from billing.egress import egress_term_use
from rental.api import ApiError, api_endpoint, customer_lease

from .telemetry import read_lease_telemetry

RESOLUTIONS = (1, 5, 10, 15, 30, 60, 360, 1440)   # minutes a point
MAX_POINTS = 1500                                # per card and request: pick a coarser resolution
COLUMNS = ("at", "util", "mem_mb", "temp_c", "power_w", "sm_mhz")
RELATIVE = re.compile(r"^(\d{1,4})([mhd])$")


def _moment(value: str | None, now: datetime, name: str) -> datetime | None:
    """RFC 3339, or a span back from now: `90m`, `6h`, `7d`."""
    if value is None or value == "":
        return None
    if match := RELATIVE.match(value):
        unit = {"m": "minutes", "h": "hours", "d": "days"}[match[2]]
        return now - timedelta(**{unit: int(match[1])})
    try:
        at = parse_datetime(value)
    except ValueError:
        at = None
    if at is None:
        raise ApiError(400, "invalid", _("“%(name)s” must be an RFC 3339 time or a span like 6h, 90m or 7d.")
                       % {"name": name})
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _resolution(value: str | None, span_minutes: int) -> int:
    if not value:
        return next((r for r in RESOLUTIONS if span_minutes / r <= MAX_POINTS), RESOLUTIONS[-1])
    if not value.isdigit() or int(value) not in RESOLUTIONS:
        raise ApiError(400, "invalid", _("“resolution” must be one of %(values)s (minutes a point).")
                       % {"values": ", ".join(map(str, RESOLUTIONS))})
    if span_minutes / int(value) > MAX_POINTS:
        raise ApiError(400, "invalid", _("At most %(n)s points per GPU: ask a coarser resolution or a shorter span.")
                       % {"n": MAX_POINTS})
    return int(value)


@api_endpoint("GET", scope="read", right="view")
def lease_metrics(request, lease_id: int):
    lease = customer_lease(request, lease_id)
    now = timezone.now()
    until = _moment(request.GET.get("until"), now, "until") or now
    since = _moment(request.GET.get("since"), now, "since") or until - timedelta(hours=24)
    oldest = now - timedelta(days=settings.WORKBENCH_TELEMETRY_MAX_AGE_DAYS + 400)
    if not oldest <= since < until or until - since > timedelta(days=31):
        raise ApiError(400, "invalid", _("“since” must be before “until”, at most 31 days apart."))
    span = int((until - since).total_seconds() // 60) + 1
    resolution = _resolution(request.GET.get("resolution"), span)
    series, events = read_lease_telemetry(lease.pk, series_since=since, events_since=since, until=until,
                                          step_minutes=resolution)
    gpus = [{"node": s.node_id, "gpu": s.gpu_index,
             "points": [[at.isoformat().replace("+00:00", "Z"), *(values[c] for c in COLUMNS[1:])]
                        for at, values in s.points]}
            for s in series]
    egress = egress_term_use(lease, now)
    return JsonResponse({
        "lease": lease.pk, "since": since.isoformat().replace("+00:00", "Z"),
        "until": until.isoformat().replace("+00:00", "Z"), "resolution_minutes": resolution,
        "columns": list(COLUMNS), "gpus": gpus,
        "events": [{**e, "at": e["at"].isoformat().replace("+00:00", "Z")} for e in events],
        "egress": None if egress is None else {
            "term_start": egress["term_start"].isoformat().replace("+00:00", "Z"),
            "tb_used": str(egress["tb_used"]), "included_tb": str(egress["included_tb"]),
            "over_tb": str(egress["over_tb"])},
        "idle": {"util_percent": settings.WORKBENCH_IDLE_UTIL_PERCENT, "hours": settings.WORKBENCH_IDLE_HOURS},
    })
