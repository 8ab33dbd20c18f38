"""The ops dashboard's storage panel: each site's cluster (health, replicas, full, alert)
and this month's storage income per site, from the ledger entries that paid for storage."""
from datetime import datetime

from django.db.models import Sum

from ..services import month_start
from .models import StorageCharge, StorageCluster, VolumeStore


def storage_panel(now: datetime) -> dict:
    since = month_start(now)
    income = {row["site__code"]: -(row["cents"] or 0) for row in
              StorageCharge.objects.filter(entry__at__gte=since, entry__at__lte=now)
              .values("site__code").annotate(cents=Sum("entry__amount_cents"))}
    clusters = list(StorageCluster.objects.select_related("site").order_by("site__code"))
    sites = sorted(set(income) | {c.site.code for c in clusters})
    by_site = {c.site.code: c for c in clusters}
    return {
        "since": since,
        "rows": [{"site": code, "cluster": by_site.get(code), "income_cents": income.get(code, 0)} for code in sites],
        "income_cents": sum(income.values()),
        "alerts": [f"Storage at {c.site.code}: {c.alert}" for c in clusters if c.alert],
        "purges_failing": VolumeStore.objects.filter(state=VolumeStore.State.PURGING, attempts__gt=0).count(),
    }
