"""The missed-renewal alarm: billing panels' classic failure is a renewal invoice that silently
never gets made (the sweep failed for one lease, a bug skipped it, a row was deleted) — the
customer is never asked to pay, and the lease is suspended at its end as unpaid; or two
invoices ask for the same term and the customer pays twice.

Each lifecycle pass checks every active lease that has been in its renewal window for
``RENEWAL_CHECK_GRACE_MINUTES`` (the renewal sweep of a busy pass gets that long to reach it):
it must have exactly one renewal invoice for its next term — the one for the term starting at
its end (not void), counting with it any other renewal invoice of the lease still open (one
left over from an earlier end date asks for money too). None or more than one raises an
operator alert: an audit row once per lease and term (``renewal_invoice_missing`` /
``renewal_invoice_duplicate``), an error in the log, and a line on the operators' dashboard
for as long as it lasts (``renewal_alerts``)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, F, Q

from billing.models import Invoice
from inventory.audit import audit_record
from inventory.models import AuditEntry
from rental import rules
from rental.lifecycle import BATCH, Transition
from rental.models import Lease, LeaseState

log = logging.getLogger(__name__)

MISSING = "renewal_invoice_missing"
DUPLICATE = "renewal_invoice_duplicate"


@dataclass(frozen=True)
class RenewalAnomaly:
    lease: Lease
    invoices: tuple[int, ...]  # the renewal invoices that claim the lease's next term

    @property
    def action(self) -> str:
        return MISSING if not self.invoices else DUPLICATE

    def text(self) -> str:
        when = f"{self.lease.ends_at:%Y-%m-%d %H:%M} UTC"
        if not self.invoices:
            return (f"Lease #{self.lease.pk} ({self.lease.customer}) ends {when} and has no renewal invoice for its "
                    f"next term: the customer is not asked to pay (renewal sweep failed? see the log)")
        ids = ", ".join(f"#{pk}" for pk in self.invoices)
        return (f"Lease #{self.lease.pk} ({self.lease.customer}) ends {when} and has {len(self.invoices)} open "
                f"renewal invoices for its next term ({ids}): void the extra one before it is paid twice")


def grace() -> timedelta:
    return timedelta(minutes=settings.RENEWAL_CHECK_GRACE_MINUTES)


def renewal_anomalies(now: datetime, limit: int | None = None) -> list[RenewalAnomaly]:
    """Active leases in their renewal window (past the grace) without exactly one renewal
    invoice for their next term: one query, and one more for the invoices when there are any."""
    claims = Count("invoices", filter=Q(invoices__kind=Invoice.Kind.RENEWAL) & ~Q(invoices__state=Invoice.State.VOID)
                   & (Q(invoices__term_start=F("ends_at")) | Q(invoices__state=Invoice.State.OPEN)))
    wrong = (Lease.objects.filter(state=LeaseState.ACTIVE, ends_at__isnull=False,
                                  ends_at__lte=now + rules.renewal_lead() - grace())
             .annotate(claims=claims).exclude(claims=1).select_related("customer").order_by("ends_at", "pk"))
    leases = list(wrong[:limit] if limit is not None else wrong)
    if not leases:
        return []
    per_lease: dict[int, list[int]] = {}
    for lease_id, pk, term_start, state, ends_at in (
            Invoice.objects.filter(kind=Invoice.Kind.RENEWAL, lease__in=[x.pk for x in leases])
            .exclude(state=Invoice.State.VOID).order_by("lease_id", "pk")
            .values_list("lease_id", "pk", "term_start", "state", "lease__ends_at")):
        if term_start == ends_at or state == Invoice.State.OPEN:
            per_lease.setdefault(lease_id, []).append(pk)
    return [RenewalAnomaly(lease, tuple(per_lease.get(lease.pk, ()))) for lease in leases]


def sweep_renewal_check(now: datetime, limit: int = BATCH) -> list[Transition]:
    """For ops.lifecycle.SWEEPS: an alert for each anomaly not alerted before (once per
    lease, term and kind); the dashboard shows them all while they last."""
    done = []
    for anomaly in renewal_anomalies(now):
        lease = anomaly.lease
        term = lease.ends_at.isoformat()
        if AuditEntry.objects.filter(action=anomaly.action, object_type=lease._meta.label, object_id=str(lease.pk),
                                     detail__term_start=term).exists():
            continue
        log.error("missed-renewal alarm: %s", anomaly.text())
        audit_record(actor=None, action=anomaly.action, obj=lease, at=now,
                     detail={"term_start": term, "invoices": list(anomaly.invoices)})
        done.append(Transition(lease.pk, f"alert: {anomaly.action} for the term from {term}"))
        if len(done) >= limit:
            break
    return done


def renewal_alerts(now: datetime, limit: int = 100) -> list[str]:
    """The dashboard's lines, one per lease (bounded)."""
    return [anomaly.text() for anomaly in renewal_anomalies(now, limit)]
