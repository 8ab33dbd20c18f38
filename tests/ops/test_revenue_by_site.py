"""Storage income in the dashboard's net revenue and in the exports, per site —
volumes from My storage, the order page's volume add-on (created, or refunded when the
site's storage could not create it), snapshots, an add-on paid in a coin. The figures are
computed by hand from the demo prices: RTX 3090 $65/week, $230/month; network volume
$14/TB-month ($3.27/TB for a week, rounded up); snapshots $6/TB-month."""
import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import LedgerEntry
from billing.revenue import revenue_between
from billing.services import balance_top_up, checkout_place_order, invoice_mark_paid, ledger_post
from inventory.models import Offer, Site
from ops.backoffice.dashboard import dashboard
from rental.lifecycle import sweep_provisioning
from rental.models import Image, Lease, Snapshot
from rental.storage import storage_delete
from storage.charges import snapshot_order, volume_order
from storage.models import OrderedVolume
from storage.snapshot_usage import sweep_snapshot_usage

JUNE = datetime(2025, 6, 10, 12, tzinfo=UTC)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGn8m0fLkz0cTqO0Jm3f9kH0xGqYwqXxZr3c0hV0kB9S alice@laptop"


def _order(customer, *, site, term, volume_tb, at, pay=True):
    return checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code=site), term=term,
        image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
        addons={"network_volume_tb": volume_tb}, pay_from_balance=pay, now=at)


def _csv(response):
    assert response.status_code == 200
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def _month(customer, at, settings, on_commit):
    """A month at two sites, everything at `at`; returns the leases and invoices by name."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=100_000, now=at)                    # a deposit
    w = {"volume": volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="data", size_tb=2,
                                now=at)}                                                 # DFW storage 2 × 1400
    with on_commit(execute=True):
        w["a"], w["a_invoice"] = _order(customer, site="DFW-1", term="month", volume_tb=1, at=at)  # 23000 + 1400
    settings.STORAGE_SIMULATED = False  # IAD-1 has no storage cluster: its add-on cannot be created
    with on_commit(execute=True):
        w["b"], w["b_invoice"] = _order(customer, site="IAD-1", term="week", volume_tb=1, at=at)  # 6827, 327 back
    settings.STORAGE_SIMULATED = True
    sweep_provisioning(at)
    # A snapshot storing 2 TB for the 15 days to `at`, deleted then: billed in arrears at `at`,
    # 2 TB × 0.5 month × $6 = IAD storage 600.
    w["snapshot"] = snapshot_order(lease=Lease.objects.get(pk=w["b"].pk), size_tb=2, now=at)
    Snapshot.objects.filter(pk=w["snapshot"].pk).update(ready_at=at - timedelta(days=15),
                                                        created_at=at - timedelta(days=15),
                                                        paid_until=at - timedelta(days=15), stored_bytes=2 * 10**12)
    storage_delete(obj=Snapshot.objects.get(pk=w["snapshot"].pk), now=at, reason="done")
    sweep_snapshot_usage(at)
    with on_commit(execute=True):
        w["c"], w["c_invoice"] = _order(customer, site="DFW-1", term="month", volume_tb=2, pay=False, at=at)
        assert invoice_mark_paid(invoice=w["c_invoice"], via="LTC", now=at, note="LTC quote #1")  # 23000 + 2800
    ledger_post(customer=customer, kind=LedgerEntry.Kind.ADJUSTMENT, amount_cents=-100, now=at, memo="fix")
    return w


@pytest.fixture
def month(catalog, customer, settings, django_capture_on_commit_callbacks):
    return _month(customer, JUNE, settings, django_capture_on_commit_callbacks)


def test_the_month_per_site(month):
    assert dict(OrderedVolume.objects.values_list("lease_id", "state")) == {
        month["a"].pk: "created", month["b"].pk: "refunded", month["c"].pk: "created"}
    sites = {r.site: r for r in dashboard(JUNE + timedelta(hours=1)).revenue_sites}
    assert set(sites) == {"DFW-1", "IAD-1"}  # the adjustment is no sale: no row
    dfw, iad = sites["DFW-1"], sites["IAD-1"]
    assert (dfw.booked_cents, dfw.storage_cents, dfw.given_back_cents, dfw.net_cents) == (
        2800 + 24400 + 25800, 2800 + 1400 + 2800, 0, 53000)
    assert (iad.booked_cents, iad.storage_cents, iad.given_back_cents, iad.net_cents) == (
        6827 + 600, 327 - 327 + 600, 327, 7100)
    total = revenue_between(datetime(2025, 6, 1, tzinfo=UTC), JUNE + timedelta(hours=1))
    assert total["net_cents"] == dfw.net_cents + iad.net_cents == 60100


def test_the_ledger_and_invoice_exports_say_site_and_storage(month, op_client):
    period = {"date_from": "2025-06-01", "date_to": "2025-06-30"}
    ledger = _csv(op_client.get(reverse("admin:ops_exports"), {"what": "ledger", **period}))
    rows = {(r["site"], r["product"], r["revenue_cents"], r["storage_revenue_cents"]) for r in ledger}
    assert ("DFW-1", "volume", "2800", "2800") in rows             # My storage, from the balance
    assert ("DFW-1", "invoice", "24400", "1400") in rows           # an order with its 1 TB add-on
    assert ("IAD-1", "invoice", "6827", "327") in rows             # an order whose add-on ...
    assert ("IAD-1", "volume", "-327", "-327") in rows             # ... came back, not created
    assert ("IAD-1", "snapshot", "600", "600") in rows
    assert ("", "", "0", "0") in rows                               # the top-up and the adjustment
    # The order paid in LTC is a journal row beside the entries: revenue, no balance effect.
    coin_row = next(r for r in ledger if r["entry_id"] == f"invoice:{month['c_invoice'].pk}")
    assert (coin_row["kind"], coin_row["site"], coin_row["revenue_cents"], coin_row["storage_revenue_cents"],
            coin_row["amount_cents"]) == ("paid_outside", "DFW-1", "25800", "2800", "")
    assert sum(int(r["storage_revenue_cents"]) for r in ledger) == 2800 + 1400 + 600 + 2800
    # The books reconcile: the export's revenue column is the dashboard's net for the month.
    total = revenue_between(datetime(2025, 6, 1, tzinfo=UTC), datetime(2025, 6, 30, 23, 59, 59, tzinfo=UTC))
    assert sum(int(r["revenue_cents"]) for r in ledger) == total["net_cents"] == 60100
    invoices = {r["invoice_id"]: r for r in _csv(op_client.get(reverse("admin:ops_exports"),
                                                              {"what": "invoices", **period}))}
    coin = invoices[str(month["c_invoice"].pk)]
    assert (coin["site"], coin["amount_cents"], coin["storage_cents"], coin["paid_via"]) == ("DFW-1", "25800", "2800",
                                                                                            "LTC")


def test_the_dashboard_page_shows_net_revenue_by_site(catalog, customer, op_client, settings,
                                                     django_capture_on_commit_callbacks):
    _month(customer, timezone.now() - timedelta(seconds=5), settings, django_capture_on_commit_callbacks)
    page = op_client.get(reverse("admin:ops_dashboard")).content.decode()
    table = page.split('id="revenue-by-site"')[1].split("</table>")[0]
    assert "<td>DFW-1</td><td class=\"num\">$530.00</td><td class=\"num\">$70.00</td><td class=\"num\">$0.00</td>" \
           "<td class=\"num\">$530.00</td>" in table
    assert "<td>IAD-1</td><td class=\"num\">$74.27</td><td class=\"num\">$6.00</td><td class=\"num\">$3.27</td>" \
           "<td class=\"num\">$71.00</td>" in table
    # the storage panel's income per site is that storage share
    panel = page.split('id="storage-panel"')[1].split("</section>")[0]
    assert "$70.00" in panel and "$6.00" in panel
