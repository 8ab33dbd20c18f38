"""The public status page: each active site's state now, from the open incidents that
touch it (site, node or GPU), and the incidents of the last days. No customer data."""
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Q

from .models import Incident, Site


@dataclass
class SiteStatus:
    site: Site
    open_incidents: list = field(default_factory=list)

    @property
    def level(self) -> str:
        """'outage' when the whole site is down, 'degraded' when a part of it is, else 'ok'."""
        if any(i.site_id and i.kind == Incident.Kind.DOWN for i in self.open_incidents):
            return "outage"
        return "degraded" if self.open_incidents else "ok"


def _site_of(incident: Incident) -> Site:
    if incident.site_id:
        return incident.site
    if incident.node_id:
        return incident.node.site
    return incident.slot.node.site


def site_statuses(*, now: datetime, days: int) -> tuple[list[SiteStatus], list[Incident]]:
    recent = list(Incident.objects.filter(Q(ends_at__isnull=True) | Q(ends_at__gte=now - timedelta(days=days)),
                                          starts_at__lte=now)
                  .select_related("site", "node__site", "slot__node__site").order_by("-starts_at", "-pk"))
    statuses = {s.pk: SiteStatus(s) for s in Site.objects.filter(is_active=True).order_by("code")}
    for incident in recent:
        incident.site_code = _site_of(incident).code
        if (incident.ends_at is None or incident.ends_at > now) and _site_of(incident).pk in statuses:
            statuses[_site_of(incident).pk].open_incidents.append(incident)
    return list(statuses.values()), recent
