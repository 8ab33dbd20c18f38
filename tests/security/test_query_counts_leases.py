"""Queries per page do not grow with the number of leases (the inventory side — nodes —
is tests/security/test_headers_and_settings.py): a customer's leases page, a lease page,
the invoices page and the API list cost the same number of queries with 2 leases as with
40 (each with its invoice and events)."""
from collections import Counter

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice, InvoiceLine
from rental.accounts.services import api_token_create
from rental.models import Lease, LeaseEvent
from tests.billing.payments_helpers import offline_coins, running
from tests.factories import place

pytestmark = pytest.mark.django_db


def clone_leases(customer, n):
    """n more leases like the first, each with its own invoice, lines and events."""
    lease = Lease.objects.filter(customer=customer).first()
    invoice = Invoice.objects.get(lease=lease)
    skip = {"id"}
    for _ in range(n):
        data = {k: v for k, v in model_to_dict(lease).items() if k not in skip}
        copy = Lease.objects.create(**{f"{k}_id" if k in {"customer", "offer", "site", "image"} else k: v
                                       for k, v in data.items()})
        inv = {k: v for k, v in model_to_dict(invoice).items() if k not in skip}
        inv_copy = Invoice.objects.create(**{f"{k}_id" if k in {"customer", "lease"} else k: v
                                             for k, v in inv.items()} | {"lease_id": copy.pk})
        InvoiceLine.objects.bulk_create([InvoiceLine(invoice=inv_copy, description=line.description,
                                                     quantity=line.quantity, unit_cents=line.unit_cents,
                                                     amount_cents=line.amount_cents)
                                         for line in invoice.lines.all()])
        LeaseEvent.objects.bulk_create([LeaseEvent(lease=copy, kind=e.kind, from_state=e.from_state,
                                                   to_state=e.to_state, reason=e.reason, at=e.at)
                                        for e in lease.events.all()])


def counts(client, lease, auth):
    pages = {"leases": reverse("lease_list"), "lease": reverse("lease_detail", args=[lease.pk]),
             "invoices": reverse("billing:invoices")}
    out = {}
    for name, url in pages.items():
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        out[name] = len(ctx.captured_queries)
    with CaptureQueriesContext(connection) as ctx:
        body = client.get(reverse("api_leases"), **auth).json()
    out["api"] = len(ctx.captured_queries)
    return out, len(body["leases"])


def test_customer_pages_cost_the_same_with_many_leases(client, catalog, customer):
    lease, _invoice = place(customer)
    place(customer)
    client.force_login(customer)
    _token, raw = api_token_create(customer=customer, name="q")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    counts(client, lease, auth)  # warm: session, content types
    few, listed_few = counts(client, lease, auth)
    clone_leases(customer, 38)
    many, listed_many = counts(client, lease, auth)
    assert (listed_few, listed_many) == (2, 40)
    assert many == few, {"2 leases": few, "40 leases": many}


def test_the_lease_page_asks_each_question_once(client, catalog, customer, settings):
    """A running lease's page: its blocks (status, instance, workbench, timeline, record links,
    invoices) share what they read of the lease instead of each reading it again
    (core.memo.memo_on_instance), so no query runs twice in one render."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    with offline_coins():
        lease = running(customer, timezone.now())[0]
    client.force_login(customer)
    url = reverse("lease_detail", args=[lease.pk])
    client.get(url)  # warm: session, content types
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    repeated = {sql: n for sql, n in Counter(q["sql"] for q in ctx.captured_queries).items() if n > 1}
    assert repeated == {}
    assert len(ctx.captured_queries) <= 31, len(ctx.captured_queries)
