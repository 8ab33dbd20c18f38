"""One lifecycle pass: every sweep, in dependency order, in committed batches. Called every minute by
Celery beat (ops.tasks.lifecycle_tick) and by `manage.py lifecycle`. The sweeps read
customers with their settings (language, auto-renew) in the same query as the due leases."""
import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from billing.models import Invoice
from billing.payments import health as payments_health
from billing.payments import reversals as payments_reversals
from billing.payments import services as payments
from billing.refunds import lease_fail_and_refund
from billing.renewals import renewal_invoices_create
from billing.services import order_invoice_expire
from rental import lifecycle as rental_sweeps
from rental import rules
from rental.agent import FakeAgent, agent_override
from rental.lifecycle import BATCH, DUE_LEASE_RELATED, Transition
from rental.models import Lease, LeaseState
from rental.notices import sweep_state_notices
from rental.notifications.services import sweep_webhooks
from storage.charges import sweep_storage
from storage.snapshot_usage import sweep_snapshot_usage
from storage.sweeps import sweep_ceph

from . import renewal_check
from .locks import exclusive

log = logging.getLogger(__name__)


def sweep_expire_orders(now: datetime, limit: int = BATCH) -> list[Transition]:
    # Not while a coin watcher has yet to scan past the deadline (a payment the
    # chain dates on time wins over this sweep, whichever runs first after an outage)
    waiting = Invoice.objects.filter(payments_health.awaiting_watchers(
        now, coin_field="quotes__coin", deadline_field="expires_at")).values("pk")
    due = (Invoice.objects.filter(kind=Invoice.Kind.ORDER, state=Invoice.State.OPEN, expires_at__lte=now)
           .exclude(pk__in=waiting).order_by("expires_at", "pk")[:limit])
    return [Transition(inv.lease_id, f"order invoice #{inv.pk} expired → cancelled")
            for inv in due if order_invoice_expire(invoice=inv, now=now)]


def sweep_provisioning_deadline(now: datetime, limit: int = BATCH) -> list[Transition]:
    """No lease stays provisioning forever: past NODE_PROVISIONING_DEADLINE it fails and
    is refunded to the balance (billing.refunds.lease_fail_and_refund)."""
    due = (Lease.objects.filter(state=LeaseState.PROVISIONING,
                                provisioning_started_at__lte=now - settings.NODE_PROVISIONING_DEADLINE)
           .select_related("customer", "offer__gpu_model").order_by("provisioning_started_at", "pk")[:limit])
    done = []
    for lease in due:
        refunded = lease_fail_and_refund(lease=lease, now=now)
        if refunded is not None:
            done.append(Transition(lease.pk, f"provisioning → failed, {refunded} cents refunded to the balance"))
    return done


def sweep_renewal_invoices(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Renewals of active leases only: a lease that never became active is not renewed
    (it becomes active or fails within NODE_PROVISIONING_DEADLINE). The batch is issued (and
    auto-paid) as one (billing.renewals.renewal_invoices_create); should it fail, each lease
    is tried on its own, so one lease that cannot be renewed does not hold back the others."""
    invoiced = Invoice.objects.filter(lease=OuterRef("pk"), kind=Invoice.Kind.RENEWAL, term_start=OuterRef("ends_at"))
    # Only active leases have a term: one still provisioning has not started it.
    due = list(Lease.objects.filter(state=LeaseState.ACTIVE, ends_at__lte=now + rules.renewal_lead())
               .exclude(Exists(invoiced)).select_related(*DUE_LEASE_RELATED).order_by("ends_at", "pk")[:limit])
    return [Transition(invoice.lease_id, f"renewal invoice #{invoice.pk}"
                       + (" (paid from balance)" if invoice.state == Invoice.State.PAID else ""))
            for invoice in _renewals_made(due, now)]


def _renewals_made(due: list[Lease], now: datetime) -> list[Invoice]:
    try:
        with transaction.atomic():
            return renewal_invoices_create(due, now=now)
    except Exception:
        if len(due) == 1:
            raise
        log.exception("renewal batch of %d leases failed; renewing them one by one", len(due))
    made = []
    for lease in due:
        try:
            with transaction.atomic():
                made += renewal_invoices_create([lease], now=now)
        except Exception:
            log.exception("renewal of lease #%s failed; the next pass tries again", lease.pk)
    return made


def sweep_void_dead_renewals(now: datetime, limit: int = BATCH) -> list[Transition]:
    """Renewal invoices of leases that were released are void; a payment that still
    arrives for them goes to the balance (the coin layer credits it as late)."""
    dead = (Invoice.objects.filter(kind=Invoice.Kind.RENEWAL, state=Invoice.State.OPEN,
                                   lease__state__in=[LeaseState.RELEASED, LeaseState.WIPED, LeaseState.CANCELLED,
                                                    LeaseState.FAILED])
            .values_list("pk", flat=True)[:limit])
    # locked and re-checked, then one update for the batch: a payment that got there first keeps its invoice
    still_open = list(Invoice.objects.select_for_update().filter(pk__in=list(dead), state=Invoice.State.OPEN)
                      .order_by("pk").values_list("pk", "lease_id"))
    Invoice.objects.filter(pk__in=[pk for pk, _ in still_open]).update(state=Invoice.State.VOID,
                                                                        note="lease released unpaid")
    return [Transition(lease_id, f"renewal invoice #{pk} void") for pk, lease_id in still_open]


SWEEPS = [
    ("expire_quotes", payments.sweep_expire_quotes),
    ("expire_orders", sweep_expire_orders),
    ("provisioning", rental_sweeps.sweep_provisioning),
    ("provisioning_deadline", sweep_provisioning_deadline),
    ("reminders", rental_sweeps.sweep_reminders),
    ("renewal_invoices", sweep_renewal_invoices),
    ("renewal_check", renewal_check.sweep_renewal_check),  # every lease due has exactly one renewal invoice
    ("suspend", rental_sweeps.sweep_suspend),
    ("release", rental_sweeps.sweep_release),
    ("void_dead_renewals", sweep_void_dead_renewals),
    ("reversed_payments", payments_reversals.sweep_reversed_payments),
    ("state_notices", sweep_state_notices),
    ("storage", sweep_storage),
    ("snapshots", rental_sweeps.sweep_snapshots),  # stalled attempts, moves waiting for a copy
    ("snapshot_usage", sweep_snapshot_usage),  # snapshots billed per TB-month stored, in arrears
    ("ceph", sweep_ceph),  # caps, purges, object storage metering (storage/)
    ("key_destruction", rental_sweeps.sweep_key_destruction),
    ("wipe", rental_sweeps.sweep_wipe),
    ("webhooks", sweep_webhooks),  # due deliveries and retries
]


#: Sweeps a dry run leaves out: they act on a storage cluster (purge an orphan subvolume,
#: create a paid volume), which a rolled-back transaction cannot undo.
UNPREVIEWABLE_SWEEPS = frozenset({"ceph"})


def run_lifecycle(now: datetime, *, dry_run: bool = False) -> list[tuple[str, Transition]]:
    """Run every sweep once; each transition commits on its own, so a worker killed
    mid-pass keeps what it did and the next pass finishes the rest. A dry run does the
    same work inside one transaction that it rolls back, with hosts and storage clusters
    left alone (UNPREVIEWABLE_SWEEPS are not run)."""
    if not dry_run:
        return _run_sweeps(now)
    previewable = [(name, sweep) for name, sweep in SWEEPS if name not in UNPREVIEWABLE_SWEEPS]
    with agent_override(FakeAgent()), transaction.atomic():
        results = _run_sweeps(now, previewable)
        transaction.set_rollback(True)
    return results


SKIPPED = "skipped: another pass running"


def run_lifecycle_exclusive(now: datetime, on_start=None) -> list[tuple[str, Transition]] | None:
    """The pass that beat ticks and `manage.py lifecycle` run; None (at once)
    when another pass holds the lock: a second beat, a slow pass overlapping the next
    tick or two workers never sweep concurrently."""
    with exclusive("lifecycle", ttl=timedelta(seconds=settings.LIFECYCLE_LOCK_SECONDS)) as held:
        if not held:
            return None
        if on_start:
            on_start(now)
        return run_lifecycle(now)


def _run_sweeps(now: datetime, sweeps=SWEEPS) -> list[tuple[str, Transition]]:
    """Rounds of one batch per sweep, in dependency order, each batch of at most
    LIFECYCLE_BATCH due rows one transaction: its transitions (guarded updates, each with its
    audit row) commit together, and what they trigger on the host or by e-mail runs once it
    committed — a commit per batch instead of per lease (a commit waits for the WAL flush).
    A full batch means more may be due, so that sweep is in the next round, until every
    sweep's batch came back short or the pass has used LIFECYCLE_PASS_BUDGET_SECONDS (the
    rest is the next pass's). Rounds, not one sweep until it is done: a burst of 10,000 terms
    ending together cannot spend the pass on reminders while suspensions and releases wait.
    A worker killed mid-pass keeps every batch it committed; the next pass redoes
    the rest (every transition is guarded, so nothing is done twice)."""
    results: list[tuple[str, Transition]] = []
    size = settings.LIFECYCLE_BATCH
    deadline = time.monotonic() + settings.LIFECYCLE_PASS_BUDGET_SECONDS
    pending = list(sweeps)
    while pending:
        full = []
        for name, sweep in pending:
            with transaction.atomic():
                batch = sweep(now, limit=size)
            results.extend((name, t) for t in batch)
            if len(batch) >= size:
                full.append((name, sweep))
        pending = full if time.monotonic() < deadline else []
    return results
