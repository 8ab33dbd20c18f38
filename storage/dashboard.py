"""The ops dashboard's storage panel: each site's cluster (health, replicas, full, alert)
and this month's storage income per site — the storage share of net revenue
(billing.revenue: volumes, snapshots and object storage paid from the balance, the order
page's storage add-ons, less the add-ons refunded as not created)."""
from datetime import datetime

from billing.ledger import month_start
from billing.revenue import revenue_by_site

from .models import StorageCluster, VolumeStore


def storage_panel(now: datetime) -> dict:
    since = month_start(now)
    income = {r.site: r.storage_cents for r in revenue_by_site(since, now) if r.site and r.storage_cents}
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
