"""Snapshots billed per TB-month of what they store (deduplicated, compressed
`stored_bytes`), in arrears every 30 days from the balance, prorated by the second, from
the catalog's snapshot price ($6/TB-month) — never charged twice, stopped by deletion,
counted as storage revenue of the snapshot's site. Simulated storage: the snapshot is
ready when taken; the node's measured size is set as snapshot_ready would."""
from datetime import timedelta

import pytest
from django.urls import reverse

from billing.models import LedgerEntry
from billing.revenue import revenue_by_site
from billing.services import account_for, balance_top_up
from inventory.models import AuditEntry, StorageProduct
from ops.lifecycle import SWEEPS
from rental.lifecycle import sweep_provisioning
from rental.models import Lease, Snapshot
from rental.storage import storage_delete
from storage.charges import snapshot_order
from storage.models import SnapshotMeter, SnapshotUsageCharge, StorageCharge
from storage.snapshot_usage import snapshot_cents_for, sweep_snapshot_usage
from tests.factories import order

TB = 10 ** 12
DAY = timedelta(days=1)


def balance(customer) -> int:
    return account_for(customer).balance_cents


@pytest.fixture
def lease(catalog, customer, t0, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=6500 + 10_000, now=t0)
    lease, _invoice = order(customer, t0)           # RTX 3090 week, paid from the balance
    sweep_provisioning(t0)
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.state == "active" and balance(customer) == 10_000
    return lease


def take(lease, at, stored_bytes, size_tb=1):
    snap = snapshot_order(lease=lease, size_tb=size_tb, now=at)
    Snapshot.objects.filter(pk=snap.pk).update(stored_bytes=stored_bytes, content_bytes=stored_bytes * 2)
    snap.refresh_from_db()
    assert snap.state == "available" and snap.ready_at == at
    return snap


def charges(snap) -> list[int]:
    return list(SnapshotUsageCharge.objects.filter(snapshot=snap).order_by("period_start")
                .values_list("cents", flat=True))


def test_the_price_is_the_catalogs_and_nothing_is_charged_when_taken(lease, customer, t0):
    assert StorageProduct.objects.get(kind="snapshot").cents_per_tb_month == 600  # SPEC: $6/TB-month
    take(lease, t0, TB // 2)
    assert balance(customer) == 10_000                  # billed in arrears, not when taken
    assert not LedgerEntry.objects.filter(memo__startswith="snapshot").exists()
    assert "snapshot_usage" in dict(SWEEPS)             # the lifecycle pass runs the billing


def test_half_a_tb_kept_half_a_month_is_150_cents_once(lease, customer, t0):
    snap = take(lease, t0, TB // 2)
    storage_delete(obj=snap, now=t0 + 15 * DAY, reason="customer deleted it")
    sweep_snapshot_usage(t0 + 15 * DAY + timedelta(hours=1))
    # 0.5 TB × 15/30 month × $6 = $1.50
    assert charges(snap) == [150] and balance(customer) == 10_000 - 150
    charge = SnapshotUsageCharge.objects.get(snapshot=snap)
    assert (charge.period_start, charge.period_end, charge.stored_bytes) == (t0, t0 + 15 * DAY, TB // 2)
    assert charge.entry.amount_cents == -150 and "0.500 TB stored" in charge.entry.memo
    assert StorageCharge.objects.get(entry=charge.entry).kind == "snapshot"
    assert StorageCharge.objects.get(entry=charge.entry).site.code == "DFW-1"
    assert AuditEntry.objects.filter(action="snapshot_usage_billed", object_id=str(snap.pk)).count() == 1
    for later in (t0 + 15 * DAY + timedelta(hours=2), t0 + 60 * DAY, t0 + 400 * DAY):  # reruns; deleted: no more
        sweep_snapshot_usage(later)
    assert charges(snap) == [150] and balance(customer) == 10_000 - 150
    assert SnapshotMeter.objects.get(snapshot=snap).closed_at is not None


def test_billed_every_30_days_in_arrears_until_deleted(lease, customer, t0):
    snap = take(lease, t0, TB)
    sweep_snapshot_usage(t0 + 30 * DAY - timedelta(seconds=1))
    assert charges(snap) == []                           # the period has not ended
    sweep_snapshot_usage(t0 + 30 * DAY)
    sweep_snapshot_usage(t0 + 30 * DAY)                  # the same pass twice
    assert charges(snap) == [600]
    sweep_snapshot_usage(t0 + 45 * DAY)
    assert charges(snap) == [600]
    storage_delete(obj=snap, now=t0 + 50 * DAY, reason="customer deleted it")
    sweep_snapshot_usage(t0 + 50 * DAY)                  # the last 20 days, at once
    sweep_snapshot_usage(t0 + 120 * DAY)                 # nothing accrues after deletion
    assert charges(snap) == [600, 400] and balance(customer) == 10_000 - 1000


def test_a_late_pass_bills_each_missed_period_once(lease, customer, t0):
    snap = take(lease, t0, 2 * TB)
    sweep_snapshot_usage(t0 + 95 * DAY)                  # three whole periods, the fourth still open
    assert charges(snap) == [1200, 1200, 1200]
    assert [LedgerEntry.objects.get(pk=c.entry_id).idempotency_key for c in
            SnapshotUsageCharge.objects.filter(snapshot=snap).order_by("period_start")] == [
        f"snapshot_usage:{snap.pk}:{(t0 + n * 30 * DAY):%Y%m%dT%H%M%S}" for n in range(3)]


def test_fractions_of_a_cent_carry_to_the_next_period(lease, customer, t0):
    snap = take(lease, t0, 10 ** 9)                      # 1 GB: 0.6 cents a month
    sweep_snapshot_usage(t0 + 90 * DAY)
    assert charges(snap) == [0, 1, 0]                    # 0.6 → 0, 1.2 → 1, 1.8 → 1 (rounded down on the total)
    assert SnapshotMeter.objects.get(snapshot=snap).billed_cents == 1 and balance(customer) == 10_000 - 1
    assert snapshot_cents_for(10 ** 9 * 90 * 86400, 600) == 1


def test_unpaid_lapses_then_paid_again_or_deleted_after_the_grace(lease, customer, t0):
    big = take(lease, t0, 10 * TB)                       # $60 a month; the balance holds $100
    small = take(lease, t0, TB)
    sweep_snapshot_usage(t0 + 30 * DAY)
    assert sorted(charges(big) + charges(small)) == [600, 6000]
    sweep_snapshot_usage(t0 + 60 * DAY)                  # $34 left: small's $6 is paid, big's $60 is not
    big.refresh_from_db()
    assert big.state == "lapsed" and charges(big) == [6000]
    assert SnapshotMeter.objects.get(snapshot=big).unpaid_since == t0 + 60 * DAY
    balance_top_up(customer=customer, amount_cents=6000, now=t0 + 61 * DAY)
    sweep_snapshot_usage(t0 + 61 * DAY)                  # paid within the grace: available again
    big.refresh_from_db()
    assert big.state == "available" and charges(big) == [6000, 6000]
    assert AuditEntry.objects.filter(action="snapshot_paid_again", object_id=str(big.pk)).exists()
    sweep_snapshot_usage(t0 + 90 * DAY)                  # not covered again ...
    big.refresh_from_db()
    assert big.state == "lapsed"
    sweep_snapshot_usage(t0 + 97 * DAY - timedelta(seconds=1))
    assert Snapshot.objects.get(pk=big.pk).state == "lapsed"
    sweep_snapshot_usage(t0 + 97 * DAY)                  # ... for 7 days: deleted, its objects purged
    assert Snapshot.objects.get(pk=big.pk).state == "deleted"
    assert Snapshot.objects.get(pk=big.pk).key_destroyed_at == t0 + 97 * DAY


def test_a_snapshot_paid_for_a_term_when_taken_accrues_from_its_end(lease, customer, t0):
    """Taken before billing by use: its first 30 days were paid then; not billed again."""
    snap = take(lease, t0, TB)
    Snapshot.objects.filter(pk=snap.pk).update(paid_until=t0 + 30 * DAY)
    sweep_snapshot_usage(t0 + 59 * DAY)
    assert charges(snap) == []
    sweep_snapshot_usage(t0 + 60 * DAY)
    assert charges(snap) == [600]


def test_a_snapshot_still_being_taken_costs_nothing(lease, customer, t0):
    snap = take(lease, t0, TB)
    Snapshot.objects.filter(pk=snap.pk).update(state="creating", ready_at=None)
    sweep_snapshot_usage(t0 + 60 * DAY)
    assert charges(snap) == [] and not SnapshotMeter.objects.exists()


def test_revenue_by_site_and_the_ledger_export_count_it_as_storage(lease, customer, t0, client, operator):
    import csv
    import io

    snap = take(lease, t0, TB // 2)
    storage_delete(obj=snap, now=t0 + 15 * DAY, reason="done")
    sweep_snapshot_usage(t0 + 15 * DAY)
    dfw = {r.site: r for r in revenue_by_site(t0 + 15 * DAY - timedelta(minutes=1), t0 + 15 * DAY)}["DFW-1"]
    assert (dfw.booked_cents, dfw.storage_cents, dfw.net_cents) == (150, 150, 150)
    client.force_login(operator)
    day = f"{t0 + 15 * DAY:%Y-%m-%d}"
    response = client.get(reverse("admin:ops_exports"), {"what": "ledger", "date_from": day, "date_to": day})
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r["site"], r["product"], r["amount_cents"], r["revenue_cents"], r["storage_revenue_cents"])
            for r in rows] == [("DFW-1", "snapshot", "-150", "150", "150")]


def test_my_storage_shows_the_snapshot_charges(lease, customer, t0, client):
    snap = take(lease, t0, TB // 2)
    storage_delete(obj=snap, now=t0 + 15 * DAY, reason="done")
    sweep_snapshot_usage(t0 + 15 * DAY)
    client.force_login(customer)
    html = client.get(reverse("storage_mine:index")).content.decode()
    table = html.split('id="snapshot-charges"')[1].split("</table>")[0]
    assert f"#{snap.pk}" in table and "$1.50" in table and "0.2500" in table  # 0.5 TB × half a month
    assert "$6.00 per TB-month of what each snapshot stores" in html


@pytest.mark.postgres  # row locks: skipped on SQLite by tests/conftest.py
@pytest.mark.django_db(transaction=True)
def test_two_billing_passes_at_once_charge_each_period_once(catalog, customer, t0, settings):
    from tests.billing.races import in_threads

    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=6500 + 10_000, now=t0)
    lease, _invoice = order(customer, t0)
    sweep_provisioning(t0)
    snaps = [take(Lease.objects.get(pk=lease.pk), t0, TB) for _ in range(3)]
    results = in_threads(*[lambda: sweep_snapshot_usage(t0 + 61 * DAY) for _ in range(4)])
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert [charges(s) for s in snaps] == [[600, 600]] * 3
    assert balance(customer) == 10_000 - 3 * 1200
    assert LedgerEntry.objects.filter(idempotency_key__startswith="snapshot_usage:").count() == 6


def test_the_customer_desk_shows_what_a_snapshot_stores_and_is_billed_until(lease, customer, t0, client, operator):
    snap = take(lease, t0, TB // 2)
    sweep_snapshot_usage(t0 + 30 * DAY)
    client.force_login(operator)
    html = client.get(reverse("admin:ops_customer", args=[customer.pk])).content.decode()
    table = html.split('id="snapshots"')[1].split("</table>")[0]
    assert f"<td>{snap.pk}</td>" in table and "465.7\xa0GB" in table  # filesizeformat: binary units
    assert f"{t0 + 30 * DAY:%Y-%m-%d %H:%M}" in table


def test_a_migrations_copy_is_never_billed_to_the_customer(lease, customer, t0):
    copy = take(lease, t0, TB)
    Snapshot.objects.filter(pk=copy.pk).update(purpose=Snapshot.Purpose.MIGRATION)
    kept = take(lease, t0, TB // 2)
    sweep_snapshot_usage(t0 + 30 * DAY)
    assert charges(copy) == [] and not SnapshotMeter.objects.filter(snapshot=copy).exists()
    assert charges(kept) == [300]                        # the customer's own snapshot still is
