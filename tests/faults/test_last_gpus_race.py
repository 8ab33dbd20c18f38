"""Fifty customers order the last three free GPUs at the same moment, through the real
HTTP API (Django's live server thread — as pytest-django's live_server, but with a listen
backlog of 128 instead of 10, so fifty simultaneous connects are not reset by the kernel —
one thread per client, urllib, per-customer bearer tokens): three leases, forty-seven clean 409 sold_out refusals, no slot in two live
leases, no invoice without a lease, nobody charged twice. PostgreSQL only (row locks);
the service-level race is tests/ops/lifecycle/test_races.py."""
import json
import threading
import urllib.error
import urllib.request
from collections import Counter

import pytest
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.servers.basehttp import ThreadedWSGIServer
from django.db.models import Count
from django.test.testcases import LiveServerThread

from billing.models import Invoice, LedgerEntry
from inventory.models import GpuSlot, Offer, Site, SlotAllocation
from rental.accounts.services import api_token_create
from rental.models import Lease
from rental.services import account_create

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P racer@host"
CLIENTS, FREE = 50, 3

pytestmark = [pytest.mark.postgres,  # row-lock race (tests/conftest.py skips it on SQLite)
              pytest.mark.django_db(transaction=True)]


class BacklogServer(ThreadedWSGIServer):
    request_queue_size = 128


class RaceServerThread(LiveServerThread):
    server_class = BacklogServer


@pytest.fixture
def race_server(transactional_db):
    thread = RaceServerThread("127.0.0.1", StaticFilesHandler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait(30)
    if thread.error:
        raise thread.error
    yield f"http://127.0.0.1:{thread.port}"
    thread.terminate()
    thread.join(10)


def post_order(url: str, token: str) -> tuple[int, dict]:
    body = json.dumps({"offer": "rtx-3090", "site": "DFW-1", "term": "week", "ssh_key": KEY}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_fifty_clients_race_for_the_last_three_gpus(catalog, race_server):
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    slots = list(GpuSlot.objects.filter(node__site=site, node__gpu_model=offer.gpu_model, in_service=True)
                 .order_by("node_id", "index"))
    assert len(slots) > FREE
    # Everything but three slots is already taken (by leases that are not part of this test).
    SlotAllocation.objects.bulk_create([SlotAllocation(slot=s, lease_id=10**9 + i) for i, s in enumerate(slots[FREE:])])
    tokens = [api_token_create(customer=account_create(username=f"racer{i}", password="correct horse battery 9"),
                               name="race")[1] for i in range(CLIENTS)]
    url = race_server + "/api/v1/orders"
    barrier, results = threading.Barrier(CLIENTS), [None] * CLIENTS

    def client(i):
        try:
            barrier.wait(timeout=30)
            results[i] = post_order(url, tokens[i])
        except Exception as exc:  # noqa: BLE001 - reported below
            results[i] = (None, repr(exc))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
        assert not thread.is_alive(), "a client hung"

    statuses = Counter(status for status, _ in results)
    assert statuses == {201: FREE, 409: CLIENTS - FREE}, results
    refusals = [body for status, body in results if status == 409]
    assert {body["error"] for body in refusals} == {"sold_out"}
    won = [body for status, body in results if status == 201]
    assert Lease.objects.count() == FREE and Invoice.objects.count() == FREE
    assert not Invoice.objects.filter(lease__isnull=True).exists()
    assert sorted(b["lease"]["id"] for b in won) == sorted(Lease.objects.values_list("pk", flat=True))
    assert {b["invoice"]["lease"] for b in won} == set(Lease.objects.values_list("pk", flat=True))
    live = SlotAllocation.objects.filter(released_at__isnull=True)
    assert not live.values("slot").annotate(n=Count("id")).filter(n__gt=1).exists()  # no oversold slot
    assert set(live.filter(lease_id__in=Lease.objects.values("pk")).values_list("slot_id", flat=True)) \
        == {s.pk for s in slots[:FREE]}
    assert len({lease.customer_id for lease in Lease.objects.all()}) == FREE
    assert not LedgerEntry.objects.exists()  # nobody charged
    print("race:", dict(statuses))
