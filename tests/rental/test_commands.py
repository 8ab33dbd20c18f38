"""`manage.py lifecycle` and `manage.py settle_invoice`."""
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing.models import Invoice
from billing.services import balance_top_up, checkout_place_order
from inventory.models import Offer, Site
from rental.models import Image, Lease, LeaseEvent, LeaseState

S = LeaseState
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


def place(customer, now, *, pay=True):
    if pay:
        balance_top_up(customer=customer, amount_cents=6500, now=now)
    return checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                site=Site.objects.get(code="DFW-1"), term="week",
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                pay_from_balance=pay, now=now)


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def paid_lease(catalog, customer, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    lease, _ = place(customer, timezone.now() - timedelta(minutes=5))
    lease.refresh_from_db()
    return lease


@pytest.fixture
def active_lease(paid_lease):
    from rental.lifecycle import sweep_provisioning

    assert sweep_provisioning(paid_lease.provisioning_started_at)
    paid_lease.refresh_from_db()
    return paid_lease


def test_lifecycle_runs_every_sweep_and_prints_transitions(paid_lease):
    out = run("lifecycle")
    assert f"provisioning lease#{paid_lease.pk} provisioning → active" in out
    assert "1 transition(s) made" in out
    paid_lease.refresh_from_db()
    assert paid_lease.state == S.ACTIVE
    assert "0 transition(s) made" in run("lifecycle")


def test_dry_run_at_a_future_moment_previews_and_changes_nothing(active_lease):
    at = (active_lease.ends_at + timedelta(hours=73)).isoformat()
    out = run("lifecycle", "--dry-run", "--at", at)
    for expected in ("renewal invoice", "active → suspended", "suspension notice", "dry run, rolled back"):
        assert expected in out, (expected, out)
    assert "suspended → released" not in out  # the hold counts from the stop, in this pass
    active_lease.refresh_from_db()
    assert active_lease.state == S.ACTIVE
    assert not Invoice.objects.filter(kind="renewal").exists()
    assert list(LeaseEvent.objects.filter(lease=active_lease).values_list("kind", flat=True)) == [
        "created", "paid", "provisioned"]


def test_at_without_dry_run_is_refused_unless_debug(active_lease, settings):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="--dry-run"):
        run("lifecycle", "--at", "2030-01-01T00:00:00Z")
    active_lease.refresh_from_db()
    assert active_lease.state == S.ACTIVE
    settings.DEBUG = True
    out = run("lifecycle", "--at", (active_lease.ends_at + timedelta(minutes=1)).isoformat())
    assert "active → suspended" in out
    active_lease.refresh_from_db()
    assert active_lease.state == S.SUSPENDED


def test_naive_at_means_utc_and_bad_at_is_a_clear_error(active_lease):
    naive = (active_lease.ends_at + timedelta(minutes=1)).replace(tzinfo=None).isoformat()
    assert "active → suspended" in run("lifecycle", "--dry-run", "--at", naive)
    with pytest.raises(CommandError, match="not an ISO-8601"):
        run("lifecycle", "--dry-run", "--at", "next tuesday")


def test_settle_invoice_marks_paid_and_starts_the_term(catalog, customer, operator):
    lease, invoice = place(customer, timezone.now(), pay=False)
    out = run("settle_invoice", str(invoice.pk), "--note", "bank transfer 4471", "--operator", operator.username)
    assert f"Invoice #{invoice.pk} (lease #{lease.pk}) settled manually: $65.00." in out
    invoice.refresh_from_db()
    assert (invoice.state, invoice.paid_via, invoice.note, invoice.settled_by) == (
        "paid", "manual", "bank transfer 4471", operator)
    assert Lease.objects.get(pk=lease.pk).state == S.PROVISIONING
    with pytest.raises(CommandError, match="already paid"):
        run("settle_invoice", str(invoice.pk), "--note", "again")


def test_settle_invoice_refusals(catalog, customer):
    _, invoice = place(customer, timezone.now(), pay=False)
    with pytest.raises(CommandError, match="--note must say why"):
        run("settle_invoice", str(invoice.pk), "--note", "   ")
    with pytest.raises(CommandError, match="no invoice #999999"):
        run("settle_invoice", "999999", "--note", "x")
    with pytest.raises(CommandError, match="No staff user"):
        run("settle_invoice", str(invoice.pk), "--note", "x", "--operator", "alice")
    Invoice.objects.filter(pk=invoice.pk).update(state=Invoice.State.EXPIRED)
    with pytest.raises(CommandError, match="expired, not open"):
        run("settle_invoice", str(invoice.pk), "--note", "x")
