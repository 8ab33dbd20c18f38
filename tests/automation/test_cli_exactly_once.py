"""`gpu-rent` does each write once (ADR 0011): every write sends an Idempotency-Key and a
write whose answer was lost is sent again with the same key; an error exit means nothing
was created; a listing piped into a reader that stops early ends quietly."""
import json
import os
import subprocess
import sys

import pytest
import requests
from django.utils import timezone
from gpu_rent import errors

from billing.models import Invoice, Quote
from rental.accounts.services import ssh_key_add
from rental.models import Lease
from tests.billing.payments_helpers import offline_coins, set_rate

from .helpers import KEY, _subprocess_env, login

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_with_a_coin_not_accepted_fails_and_orders_nothing(cli, catalog, customer):  # noqa: F811
    login(cli, customer, scopes=("read", "order"))
    ssh_key_add(customer=customer, name="only", public_key=KEY)
    set_rate("LTC", "80", timezone.now())
    with offline_coins():
        code, _out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--coin", "BTC")
        assert code == errors.INVALID and "coin" in err and "LTC" in err  # the valid values are named
        assert not Lease.objects.exists() and not Invoice.objects.exists()
        code, out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--coin", "ltc",
                             "--json")
    assert code == 0, err
    placed = json.loads(out)
    assert placed["quote"]["coin"] == "LTC" and Quote.objects.get().address == placed["quote"]["address"]


def test_a_write_whose_answer_is_lost_is_retried_with_its_key_and_done_once(cli, catalog, customer,  # noqa: F811
                                                                            monkeypatch):
    """The server places the order, the answer never arrives (a timeout): the client sends the
    same request with the same key and gets the first answer; one lease, one invoice."""
    from gpu_rent import client

    login(cli, customer, scopes=("read", "order", "manage"))
    ssh_key_add(customer=customer, name="only", public_key=KEY)
    monkeypatch.setattr(client, "RETRY_PAUSE_SECONDS", 0)
    real, sent = requests.Session.request, []

    def lossy(self, method, url, **kw):
        sent.append((method, url, dict(kw.get("headers") or {})))
        response = real(self, method, url, **kw)
        if method == "POST" and url.endswith("/orders") and len([s for s in sent if s[0] == "POST"]) == 1:
            raise requests.ReadTimeout("the answer was lost")
        return response

    monkeypatch.setattr(requests.Session, "request", lossy)
    code, out, err = cli("create", "--gpu", "3090", "--site", "DFW-1", "--cycle", "week", "--json")
    assert code == 0, err
    posts = [headers for method, _url, headers in sent if method == "POST"]
    assert len(posts) == 2 and posts[0]["Idempotency-Key"] == posts[1]["Idempotency-Key"]
    assert Lease.objects.filter(customer=customer).count() == 1 == Invoice.objects.filter(customer=customer).count()
    assert json.loads(out)["lease"]["id"] == Lease.objects.get().pk
    # Every other write sends a key of its own.
    sent.clear()
    assert cli("auto-renew", str(Lease.objects.get().pk), "off")[0] == 0
    keys = [h.get("Idempotency-Key") for m, _u, h in sent if m != "GET"]
    assert keys and all(keys)


def test_a_listing_into_a_closed_pipe_ends_without_a_traceback(cli, catalog):  # noqa: F811
    """`gpu-rent offers | head -0`: the reader is gone before the first line is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "gpu_rent", "offers", "--url", cli.url], stdout=write_end,
                              stderr=subprocess.PIPE, env=_subprocess_env(cli), text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 0 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
