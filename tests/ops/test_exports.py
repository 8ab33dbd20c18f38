"""CSV exports for a period: staff only, streamed, amounts in cents and USD."""
import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.test import Client
from django.urls import reverse

from billing.models import Invoice, Payment, Quote

JUNE = datetime(2025, 6, 10, 12, tzinfo=UTC)


def rows(response):
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/csv")
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_exports(catalog, customer, place, op_client):
    june = place(customer, JUNE, term="week")
    place(customer, datetime(2025, 7, 2, tzinfo=UTC), term="week")  # outside the period
    invoice = Invoice.objects.get(lease=june)
    quote = Quote.objects.create(invoice=invoice, coin="BTC", address="bc1qexample", amount=10_000_000,
                                 usd_cents=6500, rate_usd_per_coin=Decimal("65000"), rate_source="operator",
                                 rate_at=JUNE, uri="bitcoin:x", created_at=JUNE, expires_at=JUNE + timedelta(minutes=30))
    Payment.objects.create(quote=quote, coin="BTC", txid="ab" * 32, output_index=1, address="bc1qexample",
                           amount=10_000, confirmations=3, state="confirmed", first_seen_at=JUNE)
    url = reverse("admin:ops_exports")
    period = {"date_from": "2025-06-01", "date_to": "2025-06-30"}

    leases = rows(op_client.get(url, {"what": "leases", **period}))
    assert [r["lease_id"] for r in leases] == [str(june.pk)]
    assert leases[0]["price_cents"] == "6500" and leases[0]["price_usd"] == "65.00" and leases[0]["site"] == "DFW-1"

    invoices = rows(op_client.get(url, {"what": "invoices", **period}))
    assert [(r["invoice_id"], r["amount_cents"], r["amount_usd"], r["state"], r["paid_via"]) for r in invoices] == [
        (str(invoice.pk), "6500", "65.00", "paid", "balance")]

    payments = rows(op_client.get(url, {"what": "payments", **period}))
    # 10,000 sat at $65,000/BTC = $6.50
    assert payments == [{**payments[0], "coin": "BTC", "amount_base_units": "10000", "amount_coin": "0.0001",
                         "usd_cents": "650", "usd": "6.50", "txid": "ab" * 32, "output_index": "1"}]
    response = op_client.get(url, {"what": "payments", **period})
    assert 'filename="payments_2025-06-01_2025-06-30.csv"' in response["Content-Disposition"]

    assert op_client.get(url, {"what": "leases", "date_from": "2025-06-30", "date_to": "2025-06-01"}).status_code == 200
    assert op_client.get(url).status_code == 200  # the form


def test_exports_are_staff_only(db, customer):
    visitor = Client()
    visitor.force_login(customer)
    response = visitor.get(reverse("admin:ops_exports"), {"what": "payments", "date_from": "2025-06-01",
                                                           "date_to": "2025-06-30"})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
