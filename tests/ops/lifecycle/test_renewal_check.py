"""The missed-renewal alarm (ops/lifecycle/renewal_check.py): every lifecycle pass checks
that each active lease in its renewal window (past RENEWAL_CHECK_GRACE_MINUTES) has exactly one
renewal invoice for its next term, and alerts the operators otherwise — an audit row once per
lease and term, an error in the log, a dashboard line while it lasts."""
from datetime import timedelta

import pytest

from billing.models import Invoice
from billing.services import balance_top_up
from inventory.models import AuditEntry
from ops import lifecycle
from ops.backoffice.dashboard import dashboard
from ops.lifecycle import run_lifecycle
from rental.agent import Instance
from rental.models import LeaseState
from rental.services import lease_provisioned
from tests.billing.payments_helpers import fresh
from tests.factories import order


@pytest.fixture
def active(catalog, customer, t0):
    """A week's lease paid from the balance, running since t0; the balance is then empty, so
    its renewal invoice stays open."""
    balance_top_up(customer=customer, amount_cents=6500, now=t0)
    lease, _ = order(customer, t0)
    lease_provisioned(lease_id=lease.pk, instance=Instance("10.0.0.7", 2207), now=t0)
    lease = fresh(lease)
    assert lease.state == LeaseState.ACTIVE and lease.ends_at == t0 + timedelta(days=7)
    return lease


def in_window(lease, settings, minutes_past_grace=1):
    """The time ``minutes_past_grace`` minutes after the check starts looking at the lease."""
    return (lease.ends_at - timedelta(hours=settings.LEASE_RENEWAL_LEAD_HOURS)
            + timedelta(minutes=settings.RENEWAL_CHECK_GRACE_MINUTES + minutes_past_grace))


def renewals(lease):
    return list(Invoice.objects.filter(lease=lease, kind=Invoice.Kind.RENEWAL).order_by("pk"))


def alarms():
    return [(e.action, e.object_id, e.detail) for e in AuditEntry.objects.filter(
        action__startswith="renewal_invoice_").order_by("pk")]


def renewal_lines(now):
    return [a for a in dashboard(now).alerts if "renewal invoice" in a]


def without_the_renewal_sweep(monkeypatch):
    """The classic failure: the renewal sweep silently makes nothing (a bug skipped the lease)."""
    monkeypatch.setattr(lifecycle, "_renewals_made", lambda due, now: [])


def test_a_renewal_that_exists_raises_nothing(active, settings):
    now = in_window(active, settings)
    run_lifecycle(now)
    run_lifecycle(now + timedelta(minutes=1))
    assert [i.term_start for i in renewals(active)] == [active.ends_at]
    assert alarms() == [] and renewal_lines(now) == []


def test_a_deleted_renewal_invoice_raises_the_alarm_once_and_the_dashboard_shows_it(
        active, settings, monkeypatch, caplog):
    now = in_window(active, settings)
    run_lifecycle(now)
    [renewal] = renewals(active)
    renewal.lines.all().delete()
    renewal.delete()
    without_the_renewal_sweep(monkeypatch)
    run_lifecycle(now + timedelta(minutes=1))
    run_lifecycle(now + timedelta(minutes=2))  # raised once per lease and term, not every pass

    assert alarms() == [("renewal_invoice_missing", str(active.pk),
                         {"term_start": active.ends_at.isoformat(), "invoices": []})]
    assert any("missed-renewal alarm" in r.message and r.levelname == "ERROR" for r in caplog.records)
    [line] = renewal_lines(now + timedelta(minutes=2))
    assert line.startswith(f"Lease #{active.pk} (") and "has no renewal invoice for its next term" in line

    monkeypatch.undo()  # the sweep works again: the next pass makes the invoice, the line goes
    run_lifecycle(now + timedelta(minutes=3))
    assert len(renewals(active)) == 1 and renewal_lines(now + timedelta(minutes=3)) == []


def test_two_open_renewal_invoices_for_the_next_term_raise_the_alarm(active, settings):
    """One for the term from the lease's end, and one left open from an earlier end date: the
    customer would be asked to pay twice."""
    now = in_window(active, settings)
    run_lifecycle(now)
    [renewal] = renewals(active)
    stray = Invoice.objects.create(customer=active.customer, lease=active, kind=Invoice.Kind.RENEWAL,
                                   term_start=active.ends_at - timedelta(days=1), created_at=now,
                                   amount_cents=6500)
    run_lifecycle(now + timedelta(minutes=1))
    assert alarms() == [("renewal_invoice_duplicate", str(active.pk),
                         {"term_start": active.ends_at.isoformat(), "invoices": [renewal.pk, stray.pk]})]
    [line] = renewal_lines(now + timedelta(minutes=1))
    assert f"has 2 open renewal invoices for its next term (#{renewal.pk}, #{stray.pk})" in line

    Invoice.objects.filter(pk=stray.pk).update(state=Invoice.State.VOID)  # an operator voids the extra one
    assert renewal_lines(now + timedelta(minutes=2)) == []


def test_a_lease_new_to_its_window_gets_the_grace_before_the_alarm(active, settings, monkeypatch):
    """The renewal sweep of a busy pass may reach a lease only minutes after its window opens."""
    without_the_renewal_sweep(monkeypatch)
    run_lifecycle(in_window(active, settings, minutes_past_grace=-1))
    assert alarms() == []
    run_lifecycle(in_window(active, settings, minutes_past_grace=1))
    assert [a[0] for a in alarms()] == ["renewal_invoice_missing"]
