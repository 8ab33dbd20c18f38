"""CSV exports for a period: staff only, streamed, amounts in cents and USD."""
import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.test import Client
from django.urls import reverse

from billing.models import Invoice, Payment, Quote
from ops.backoffice.exports import csv_safe

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


def test_cells_that_a_spreadsheet_would_run_are_escaped(catalog, place, op_client, django_user_model):
    """Formula injection: a customer picks a username (or an operator's note quotes one)
    that starts with = + - @ or a tab; the CSV must carry it as text, not a formula."""
    from rental.services import account_create

    evil = account_create(username="@SUM(1+1)", password="correct horse battery 9")
    django_user_model.objects.filter(pk=evil.pk).update(username='=HYPERLINK("http://x.example","y")')
    evil.refresh_from_db()
    june = place(evil, JUNE, term="week")
    Invoice.objects.filter(lease=june).update(note="-2+3\tcmd")
    period = {"date_from": "2025-06-01", "date_to": "2025-06-30"}
    url = reverse("admin:ops_exports")

    leases = rows(op_client.get(url, {"what": "leases", **period}))
    assert leases[0]["customer"] == "'=HYPERLINK(\"http://x.example\",\"y\")"
    invoices = rows(op_client.get(url, {"what": "invoices", **period}))
    assert invoices[0]["note"] == "'-2+3\tcmd"
    # Numbers stay numbers, negative amounts (credits) included; text never passes as one.
    assert [csv_safe(v) for v in (-500, "-5.00", "-5.00e3", "+1", "@x", "\rx", "ok")] == [
        -500, "-5.00", "'-5.00e3", "'+1", "'@x", "'\rx", "ok"]


def test_an_impossible_period_is_a_clear_error(op_client):
    response = op_client.get(reverse("admin:ops_exports"),
                             {"what": "leases", "date_from": "2025-01-01", "date_to": "9999-12-31"})
    assert response.status_code == 200 and not response.streaming
    assert "Dates must be between 2000-01-01 and 2999-12-31." in response.content.decode()
