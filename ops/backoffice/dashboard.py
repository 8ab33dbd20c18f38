"""Selectors for the operators' dashboard (/admin/ops/dashboard/): capacity and money at a
glance. Each figure is one query whatever the number of rows (lists are bounded), so the
page costs a constant number of queries."""
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    Min,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.utils.translation import gettext

from billing.jobs import freshness, seconds, watched_names
from billing.ledger import month_start
from billing.models import Invoice, JobRun, PaymentReview, Quote
from billing.payments.addresses import wallets_past_gap
from billing.payments.health import coins_unwell
from billing.payments.pricing import rate_stop_alert, rates_stopped
from billing.payments.services import coins_offered
from billing.revenue import SiteRevenue, revenue_between, revenue_by_site
from inventory.models import AuditEntry, GpuSlot, SlotAllocation
from rental.models import DiskKey, Lease, LeaseState

from ..lifecycle.renewal_check import renewal_alerts

S = LeaseState
QUOTE_STUCK_AFTER = timedelta(hours=1)
LIST_LIMIT = 100
BUCKETS = ("free", "leased", "held", "down", "draining")


@dataclass
class CapacityRow:
    site: str
    model: str
    free: int = 0
    leased: int = 0
    held: int = 0
    down: int = 0
    draining: int = 0

    @property
    def total(self) -> int:
        return self.free + self.leased + self.held + self.down + self.draining


def capacity(now: datetime | None = None) -> list[CapacityRow]:
    """GPUs per site and model: free (sellable now), leased (pending, provisioning, active),
    held (suspended, slot kept 72 h), down (out of service: an incident or repair), and
    draining (idle on a node that takes no new leases, or at an inactive site). One query."""
    lease_state = Lease.objects.filter(pk=OuterRef("lease_id")).values("state")[:1]
    open_alloc_state = (SlotAllocation.objects.filter(slot=OuterRef("pk"), released_at__isnull=True)
                        .annotate(lease_state=Subquery(lease_state)).values("lease_state")[:1])
    bucket = Case(
        When(in_service=False, then=Value("down")),
        When(Q(lease_state=S.SUSPENDED), then=Value("held")),
        When(Q(lease_state__isnull=False), then=Value("leased")),
        When(Q(node__draining=True) | Q(node__site__is_active=False), then=Value("draining")),
        default=Value("free"), output_field=CharField())
    rows = (GpuSlot.objects.annotate(lease_state=Subquery(open_alloc_state)).annotate(bucket=bucket)
            .values("node__site__code", "node__gpu_model__name", "node__gpu_model__sort", "bucket")
            .annotate(n=Count("pk")).order_by())
    table: dict[tuple, CapacityRow] = {}
    for r in rows:
        key = (r["node__site__code"], r["node__gpu_model__sort"], r["node__gpu_model__name"])
        row = table.setdefault(key, CapacityRow(site=key[0], model=key[2]))
        setattr(row, r["bucket"], getattr(row, r["bucket"]) + r["n"])
    return [table[k] for k in sorted(table)]


def revenue_this_month(now: datetime) -> dict:
    """This calendar month (UTC), from the ledger (``billing.revenue``): what balances spent
    (storage included) and invoices paid from outside, minus refunds and SLA credits."""
    since = month_start(now)
    return {**revenue_between(since, now), "since": since}


def renewals_due(now: datetime) -> dict:
    """Running leases whose term ends within 24 h / 72 h, and whether their renewal is paid."""
    paid_renewal = Invoice.objects.filter(lease=OuterRef("pk"), kind=Invoice.Kind.RENEWAL,
                                          term_start=OuterRef("ends_at"), state=Invoice.State.PAID)
    leases = list(Lease.objects.filter(state__in=[S.PROVISIONING, S.ACTIVE], ends_at__gt=now,
                                       ends_at__lte=now + timedelta(hours=72))
                  .annotate(renewed=Exists(paid_renewal))
                  .select_related("customer", "offer__gpu_model", "site").order_by("ends_at", "pk")[:LIST_LIMIT])
    in_24h = [lease for lease in leases if lease.ends_at <= now + timedelta(hours=24)]
    return {"due_24h": len(in_24h), "due_72h": len(leases), "unpaid_24h": sum(not x.renewed for x in in_24h),
            "unpaid_72h": sum(not x.renewed for x in leases), "leases": leases, "truncated": len(leases) == LIST_LIMIT}


def suspended_leases(now: datetime) -> list[Lease]:
    return list(Lease.objects.filter(state=S.SUSPENDED).select_related("customer", "offer__gpu_model", "site")
                .order_by("hold_until", "pk")[:LIST_LIMIT])


@dataclass
class Hold:
    """One unpaid order holding GPUs: who, what, which slots, until when."""
    lease: Lease
    slots: list[str]
    customer_open_orders: int
    customer_has_paid: bool


def unpaid_holds() -> list[Hold]:
    """Pending (unpaid) leases with the slots they hold and when the hold expires, oldest
    expiry first; with each customer's count of open unpaid orders, to spot hoarding.
    Three queries whatever the number of rows."""
    leases = list(Lease.objects.filter(state=S.PENDING).select_related("customer", "offer__gpu_model", "site")
                  .order_by("pay_by", "pk")[:LIST_LIMIT])
    slots = defaultdict(list)
    for alloc in (SlotAllocation.objects.filter(lease_id__in=[x.pk for x in leases], released_at__isnull=True)
                  .select_related("slot__node").order_by("slot__node__name", "slot__index")):
        slots[alloc.lease_id].append(f"{alloc.slot.node.name}/gpu{alloc.slot.index}")
    customers = {x.customer_id for x in leases}
    open_orders = Counter(Lease.objects.filter(state=S.PENDING, customer_id__in=customers)
                          .values_list("customer_id", flat=True))
    paid = set(Invoice.objects.filter(state=Invoice.State.PAID, customer_id__in=customers)
               .values_list("customer_id", flat=True).distinct())
    return [Hold(lease=x, slots=slots[x.pk], customer_open_orders=open_orders[x.customer_id],
                 customer_has_paid=x.customer_id in paid) for x in leases]


def keys_pending_destruction() -> list[DiskKey]:
    return list(DiskKey.objects.filter(state=DiskKey.State.DESTROY_REQUESTED).select_related("lease")
                .order_by("destroy_requested_at", "pk")[:LIST_LIMIT])


def wipes_due(now: datetime) -> dict:
    """Ended leases whose local NVMe must be wiped: overdue now, or due within 24 h."""
    ran = Q(state__in=[S.RELEASED, S.FAILED]) | Q(state=S.CANCELLED, provisioning_started_at__isnull=False)
    leases = list(Lease.objects.filter(ran, wipe_by__lte=now + timedelta(hours=24))
                  .select_related("disk_key", "site").order_by("wipe_by", "pk")[:LIST_LIMIT])
    return {"overdue": [x for x in leases if x.wipe_by <= now], "next_24h": [x for x in leases if x.wipe_by > now]}


@dataclass
class JobStatus:
    name: str
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_result: dict = field(default_factory=dict)
    alert: str = ""
    age: timedelta | None = None       # since the last completed pass
    allowed: timedelta | None = None   # how old it may be (billing/jobs.py); None: not scheduled

    @property
    def age_text(self) -> str:
        return seconds(self.age) if self.age is not None else ""

    @property
    def allowed_text(self) -> str:
        return seconds(self.allowed) if self.allowed is not None else ""


def _minutes(delta: timedelta) -> int:
    return int(delta.total_seconds() // 60)


def job_statuses(now: datetime) -> list[JobStatus]:
    """The last run of every scheduled job and every configured coin's watcher, with the age
    of its last completed pass; an alert when that is older than the job allows (the rule the
    jobs worker's healthcheck applies, billing/jobs.py), when it never ran, or when it started
    and did not finish. A row no longer scheduled (a coin taken out) shows its age only."""
    runs = {r.name: r for r in JobRun.objects.all()}
    watched = set(watched_names())
    names = sorted(set(runs) | set(settings.CELERY_BEAT_SCHEDULE) | watched)
    out = []
    for name in names:
        run = runs.get(name)
        last_started = run and run.last_started_at
        fresh = freshness(name, now, run and run.last_finished_at)
        allowed = fresh.allowed if (name in watched or name in settings.CELERY_BEAT_SCHEDULE) else None
        status = JobStatus(name=name, last_started_at=last_started, last_finished_at=fresh.last_finished_at,
                           last_result=(run and run.last_result) or {}, age=fresh.age, allowed=allowed)
        unfinished = fresh.last_finished_at is None or (
            last_started is not None and fresh.last_finished_at < last_started)
        if last_started is None and fresh.last_finished_at is None:
            status.alert = "never ran: is celery beat running?" if allowed else ""
        elif allowed and unfinished and last_started and now - last_started > allowed:
            status.alert = (f"started {_minutes(now - last_started)} min ago and has not finished "
                            "(worker stuck or killed?)")
        elif allowed and fresh.age is not None and fresh.age > allowed:
            status.alert = (f"late: last completed {_minutes(fresh.age)} min ago "
                            f"(expected within {_minutes(allowed)} min)")
        out.append(status)
    return out


def quotes_stuck(now: datetime) -> list[Quote]:
    """Quotes in 'processing' (payment seen, confirming) for more than an hour."""
    return list(Quote.objects.filter(state=Quote.State.PROCESSING)
                .annotate(first_seen=Min("payments__first_seen_at"))
                .filter(Q(first_seen__lte=now - QUOTE_STUCK_AFTER)
                        | Q(first_seen__isnull=True, created_at__lte=now - QUOTE_STUCK_AFTER))
                .select_related("invoice").order_by("created_at", "pk")[:LIST_LIMIT])


@dataclass
class Dashboard:
    now: datetime
    capacity: list[CapacityRow]
    revenue: dict
    renewals: dict
    suspended: list
    keys_pending: list
    wipes: dict
    jobs: list[JobStatus]
    quotes_stuck: list
    coins_offered: list[str] = field(default_factory=list)
    coins_unwell: list[tuple[str, str]] = field(default_factory=list)
    payment_reviews: int = 0
    wallets_past_gap: list[str] = field(default_factory=list)
    wrong_tokens: int = 0
    revenue_sites: list[SiteRevenue] = field(default_factory=list)
    #: the price guard's stopped coins and the missed-renewal alarm, one line each
    money_alerts: list[str] = field(default_factory=list)

    @property
    def capacity_totals(self) -> dict:
        totals: dict[str, int] = defaultdict(int)
        for row in self.capacity:
            for b in BUCKETS:
                totals[b] += getattr(row, b)
        return dict(totals)

    @property
    def alerts(self) -> list[str]:
        alerts = [f"Job {j.name}: {j.alert}" for j in self.jobs if j.alert]
        if self.quotes_stuck:
            alerts.append(f"{len(self.quotes_stuck)} quote(s) stuck in processing for over an hour")
        if self.wipes["overdue"]:
            alerts.append(f"{len(self.wipes['overdue'])} wipe(s) overdue")
        if not self.coins_offered:
            alerts.append("No coin is configured: customers can pay only from their balance "
                          "(set BTC_XPUB, LTC_XPUB, … — see README)"
                          + (" · DEMO_PAYMENTS is on" if settings.DEMO_PAYMENTS else ""))
        alerts += [gettext("%(coin)s not offered to customers: %(reason)s") % {"coin": coin, "reason": reason}
                   for coin, reason in self.coins_unwell]
        if self.payment_reviews:
            alerts.append(gettext("%(n)s payment review(s) wait for an operator (held, over the cap, or reversed "
                                  "after settlement)") % {"n": self.payment_reviews})
        alerts += [gettext("%(coin)s wallet: more unpaid addresses than its gap limit (%(limit)s) past the last paid "
                           "one; restore it with a larger gap limit to see every payment") %
                   {"coin": coin, "limit": settings.ADDRESS_GAP_LIMIT} for coin in self.wallets_past_gap]
        if self.wrong_tokens:
            alerts.append(gettext("%(n)s deposit(s) of a token we do not take, to quote addresses, in the last 7 days "
                                  "(audit log: wrong_token_deposit)") % {"n": self.wrong_tokens})
        alerts += self.money_alerts
        return alerts


def dashboard(now: datetime) -> Dashboard:
    return Dashboard(now=now, capacity=capacity(now), revenue=revenue_this_month(now), renewals=renewals_due(now),
                     suspended=suspended_leases(now), keys_pending=keys_pending_destruction(),
                     wipes=wipes_due(now), jobs=job_statuses(now), quotes_stuck=quotes_stuck(now),
                     coins_offered=[str(c) for c in coins_offered()],
                     coins_unwell=coins_unwell(now),
                     payment_reviews=PaymentReview.objects.filter(state=PaymentReview.State.OPEN).count(),
                     wallets_past_gap=wallets_past_gap(),
                     wrong_tokens=AuditEntry.objects.filter(action="wrong_token_deposit",
                                                            at__gte=now - timedelta(days=7)).count(),
                     revenue_sites=revenue_by_site(month_start(now), now),
                     money_alerts=[*map(rate_stop_alert, rates_stopped()), *renewal_alerts(now, LIST_LIMIT)])
