"""The lease page's telemetry section (templates/fleet/_lease_telemetry.html): each card's
last WORKBENCH_CHART_HOURS as small server-drawn SVG charts (no JavaScript; they scale to the
page's width, so a 390 px phone shows them whole), the term's egress against its included
allowance, and the Xid / ECC events."""
from dataclasses import dataclass
from datetime import datetime, timedelta

from django import template
from django.conf import settings
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from billing.egress import egress_term_use
from rental.models import Lease, LeaseState

from ..telemetry import CardSeries, read_lease_telemetry

register = template.Library()
WIDTH, HEIGHT = 300, 60
#: (channel, label, unit, the chart's top at least, what a value is divided by for the label)
CHARTS = (("util", _("Utilisation"), "%", 100, 1), ("mem_mb", _("VRAM used"), "GiB", 1, 1024),
          ("temp_c", _("Temperature"), "°C", 100, 1), ("power_w", _("Power"), "W", 100, 1))
SHOWN = (LeaseState.PROVISIONING, LeaseState.ACTIVE, LeaseState.SUSPENDED, LeaseState.RELEASED, LeaseState.WIPED)


@dataclass
class Chart:
    label: str
    unit: str
    top: float
    last: float | None
    peak: float | None
    lines: list[str]          # SVG polyline points, one per unbroken stretch


def chart(series: CardSeries, channel: str, label, unit: str, floor: float, scale: float,
          since: datetime, until: datetime, step: timedelta) -> Chart:
    values = [(at, point[channel] / scale) for at, point in series.points if point.get(channel) is not None]
    peak = max((v for _, v in values), default=None)
    top = max(floor / scale if scale > 1 else floor, peak or 0) or 1
    span = (until - since).total_seconds() or 1
    lines, current, previous = [], [], None
    for at, value in values:
        if previous is not None and at - previous > step:      # a gap: no line across it
            lines.append(" ".join(current))
            current = []
        x = (at - since).total_seconds() / span * WIDTH
        y = HEIGHT - 2 - value / top * (HEIGHT - 4)
        current.append(f"{x:.1f},{y:.1f}")
        previous = at
    if current:
        lines.append(" ".join(current if len(current) > 1 else current * 2))
    return Chart(label=str(label), unit=unit, top=round(top, 1), last=round(values[-1][1], 1) if values else None,
                 peak=round(peak, 1) if peak is not None else None, lines=lines)


@register.simple_tag
def lease_telemetry(lease: Lease, now: datetime | None = None) -> dict | None:
    """None where the lease never ran (nothing to show)."""
    if lease.state not in SHOWN:
        return None
    now = now or timezone.now()
    step = timedelta(minutes=settings.WORKBENCH_CHART_STEP_MINUTES)
    since = now - timedelta(hours=settings.WORKBENCH_CHART_HOURS)
    series, events = read_lease_telemetry(
        lease.pk, series_since=since, events_since=now - timedelta(days=settings.WORKBENCH_TELEMETRY_MAX_AGE_DAYS),
        until=now, step_minutes=settings.WORKBENCH_CHART_STEP_MINUTES, events_limit=50)
    several_nodes = len({s.node_id for s in series}) > 1
    # A lease younger than the window is drawn from its first reading, not squeezed to the right
    start = min((s.points[0][0] for s in series if s.points), default=since)
    cards = [{"name": (f"node {s.node_id} " if several_nodes else "") + f"GPU {s.gpu_index}",
              "charts": [chart(s, *spec, start, now, step) for spec in CHARTS]} for s in series]
    egress = egress_term_use(lease, now) if lease.state in (LeaseState.ACTIVE, LeaseState.SUSPENDED) else None
    return {"cards": cards, "events": events, "egress": egress, "hours": settings.WORKBENCH_CHART_HOURS,
            "step": settings.WORKBENCH_CHART_STEP_MINUTES, "width": WIDTH, "height": HEIGHT}
