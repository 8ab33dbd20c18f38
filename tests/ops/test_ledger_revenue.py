"""The ledger is the truth for revenue — storage paid from the balance (no
invoice) counts, an invoice paid in a coin counts once, money that only reached a balance
(a top-up, a late payment of an ended lease) counts when it is spent; the ledger export
lists every entry with its share of revenue, formula-escaped like the other exports."""
import csv
import io
from datetime import UTC, datetime, timedelta

from django.urls import reverse

from billing.models import Invoice, LedgerEntry
from billing.refunds import lease_refund
from billing.services import balance_top_up, invoice_mark_paid, ledger_post
from inventory.models import Site
from ops.backoffice.dashboard import dashboard
from storage.charges import volume_order
from tests.factories import order

JUNE = datetime(2025, 6, 10, 12, tzinfo=UTC)


def rows(response):
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_net_revenue_counts_every_income_from_the_ledger(catalog, customer, operator, op_client):
    balance_top_up(customer=customer, amount_cents=20_000, now=JUNE)        # a deposit: no revenue
    volume = volume_order(customer=customer, site=Site.objects.get(code="DFW-1"), name="data", size_tb=2, now=JUNE)
    storage = -LedgerEntry.objects.get(memo__startswith=f"network volume #{volume.pk}").amount_cents
    assert storage > 0
    order(customer, JUNE)                                                    # $65 from the balance
    _, coin_paid = order(customer, JUNE, pay=False)
    assert invoice_mark_paid(invoice=coin_paid, via="LTC", now=JUNE, note="LTC quote #1")  # $65 in a coin
    refunded, _ = order(customer, JUNE)
    assert lease_refund(lease=refunded, actor=customer, now=JUNE + timedelta(minutes=5)) == 6500
    ledger_post(customer=customer, kind=LedgerEntry.Kind.ADJUSTMENT, amount_cents=-100, now=JUNE,
                memo="=HYPERLINK(\"http://evil\")")                           # a correction, not a sale

    revenue = dashboard(JUNE + timedelta(hours=1)).revenue
    assert revenue["spent_from_balance_cents"] == storage + 6500 + 6500
    assert revenue["paid_outside_cents"] == 6500 and revenue["refunds_cents"] == 6500
    assert revenue["net_cents"] == storage + 6500 + 6500 + 6500 - 6500

    ledger = rows(op_client.get(reverse("admin:ops_exports"), {
        "what": "ledger", "date_from": "2025-06-01", "date_to": "2025-06-30"}))
    entries = [r for r in ledger if r["kind"] != "paid_outside"]      # the balance's own rows
    assert sum(int(r["amount_cents"]) for r in entries) == sum(
        LedgerEntry.objects.values_list("amount_cents", flat=True))
    assert sum(int(r["revenue_cents"]) for r in ledger) == revenue["net_cents"]   # the coin sale's journal row too
    by_kind = [(r["kind"], r["amount_cents"], r["revenue_cents"]) for r in entries]
    assert ("topup", "20000", "0") in by_kind and ("refund", "6500", "-6500") in by_kind
    assert ("order", str(-storage), str(storage)) in by_kind and ("adjustment", "-100", "0") in by_kind
    memo = next(r["memo"] for r in ledger if r["kind"] == "adjustment")
    assert memo.startswith("'=HYPERLINK")  # escaped: the spreadsheet shows it, never runs it


def test_a_coin_invoice_whose_money_went_to_the_balance_counts_when_spent(catalog, customer):
    lease, invoice = order(customer, JUNE, pay=False)
    from rental.services import lease_cancel

    lease_cancel(lease_id=lease.pk, now=JUNE, from_states=["pending"], reason="expired")
    assert invoice_mark_paid(invoice=invoice, via="LTC", now=JUNE + timedelta(minutes=1), note="LTC quote #9")
    assert Invoice.objects.get(pk=invoice.pk).state == Invoice.State.PAID
    assert LedgerEntry.objects.get(idempotency_key=f"late:{invoice.pk}").amount_cents == 6500  # a deposit
    assert dashboard(JUNE + timedelta(hours=1)).revenue["net_cents"] == 0
    order(customer, JUNE + timedelta(minutes=2))  # spent: now it is revenue
    assert dashboard(JUNE + timedelta(hours=1)).revenue["net_cents"] == 6500
