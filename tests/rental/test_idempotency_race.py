"""Eight copies of one order with one Idempotency-Key at the same moment, over real HTTP
(the live server, one thread per copy): one lease, one invoice, one charge; every copy gets
the same 201. PostgreSQL only: the copies wait on the key's unique index (ADR 0011)."""
import json
import threading
import urllib.error
import urllib.request

import pytest
from django.utils import timezone

from billing.models import Invoice, LedgerEntry
from billing.services import balance_top_up
from rental.accounts.services import api_token_create
from rental.models import Lease
from tests.rental.helpers import order_body

COPIES = 8
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_simultaneous_copies_of_one_keyed_order_are_one_order(live_server, catalog, customer, settings):
    settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = settings.API_REQUESTS_PER_IP_PER_MINUTE = 1000
    balance_top_up(customer=customer, amount_cents=1_000_000, now=timezone.now())
    token = api_token_create(customer=customer, name="race", scopes=("read", "order", "pay"))[1]
    body = json.dumps(order_body(pay_from_balance=True)).encode()
    start, answers = threading.Barrier(COPIES), []

    def send():
        request = urllib.request.Request(f"{live_server.url}/api/v1/orders", data=body, method="POST", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json", "Idempotency-Key": "once"})
        start.wait(timeout=30)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answers.append((response.status, response.read()))
        except urllib.error.HTTPError as exc:
            answers.append((exc.code, exc.read()))

    threads = [threading.Thread(target=send) for _ in range(COPIES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert len(answers) == COPIES and {status for status, _ in answers} == {201}, answers
    assert len({content for _, content in answers}) == 1
    assert Lease.objects.filter(customer=customer).count() == 1 == Invoice.objects.filter(customer=customer).count()
    assert LedgerEntry.objects.filter(account__customer=customer, kind=LedgerEntry.Kind.ORDER).count() == 1
