"""The API routes and `gpu-rent` commands for what only the pages did: network volumes,
snapshots, object storage, sites and images, paying an invoice, top-ups, SLA claims, the
webhook, restore; the same rules and messages as the pages underneath."""
import json

import pytest
from django.utils import timezone
from gpu_rent import errors

from billing.models import Invoice
from billing.services import balance_top_up
from inventory.models import Site
from rental.accounts.services import api_token_create, ssh_key_add
from rental.idempotency import IdempotentRequest
from rental.models import Lease, NetworkVolume, Snapshot
from storage.models import S3Key

from .helpers import KEY, active_lease, login

pytestmark = pytest.mark.django_db(transaction=True)


def run_json(cli, *args):  # noqa: F811
    code, out, err = cli(*args, "--json")
    assert code == 0, (args, err)
    return json.loads(out)


def test_storage_sites_images_sla_and_restore_from_the_cli(cli, catalog, customer, settings):  # noqa: F811
    settings.HOST_AGENT_FAKE_DELAY = 0
    now = timezone.now()
    lease = active_lease(customer, now)
    balance_top_up(customer=customer, amount_cents=1_000_000, now=now)
    login(cli, customer)
    assert "DFW-1" in {s["code"] for s in run_json(cli, "sites")["sites"]}
    assert "pytorch-2.5-cuda-12.4" in {i["slug"] for i in run_json(cli, "images")["images"]}

    volume = run_json(cli, "volumes", "create", "--site", "dfw-1", "--size-tb", "1", "--name", "data")
    assert volume["site"] == "DFW-1" and volume["paid_until"]
    assert run_json(cli, "volumes", "attach", str(volume["id"]), str(lease.pk))["attached_to"] == [lease.pk]
    assert run_json(cli, "volumes", "detach", str(volume["id"]), str(lease.pk))["attached_to"] == []
    assert run_json(cli, "volumes", "grow", str(volume["id"]), "2")["size_tb"] == 2
    code, out, _ = cli("volumes")
    assert code == 0 and "data" in out
    assert cli("volumes", "rm", str(volume["id"]), "--yes")[0] == 0
    assert NetworkVolume.objects.get(pk=volume["id"]).state == NetworkVolume.State.DELETED

    snap = run_json(cli, "snapshots", "take", str(lease.pk), "--size-tb", "1")
    assert snap["lease"] == lease.pk and Snapshot.objects.filter(pk=snap["id"]).exists()
    assert cli("snapshots", "rm", str(snap["id"]), "--yes")[0] == 0

    account = run_json(cli, "s3", "open", "--site", "DFW-1", "--quota-gb", "10")
    pair = run_json(cli, "s3", "key-new", str(account["id"]))
    assert pair["secret_key"] and pair["access_key"]
    key = S3Key.objects.get(access_key=pair["access_key"])
    rotated = run_json(cli, "s3", "key-rotate", str(key.pk))
    assert rotated["access_key"] != pair["access_key"]
    new_key = S3Key.objects.get(access_key=rotated["access_key"])
    assert run_json(cli, "s3", "key-revoke", str(new_key.pk))["revoked"] == new_key.pk
    assert run_json(cli, "s3")["accounts"][0]["keys"] == []

    assert run_json(cli, "sla")["claims"] == []
    topup = run_json(cli, "top-up", "50")["invoice"]
    assert topup["kind"] == "topup" and topup["amount_cents"] == 5000
    code, _out, err = cli("restore", str(lease.pk), "999999")  # not a snapshot of this customer
    assert code in (errors.REFUSED, errors.NOT_FOUND, errors.INVALID) and err


def test_an_order_at_an_unknown_site_names_the_sites_and_creates_nothing(cli, catalog, customer):  # noqa: F811
    login(cli, customer)
    ssh_key_add(customer=customer, name="k", public_key=KEY)
    code, _out, err = cli("create", "--gpu", "4090", "--site", "LAS-1", "--image", "pytorch-2.5-cu124",
                          "--cycle", "week")
    assert code == errors.INVALID
    assert "valid sites: DFW-1, IAD-1, PDX-1" in err and "valid images:" in err and "pytorch-2.5-cuda-12.4" in err
    assert not Lease.objects.exists() and not Invoice.objects.exists()
    code, _out, err = cli("create", "--gpu", "no-such-gpu", "--site", "DFW-1", "--cycle", "week")
    assert code == errors.NOT_FOUND and "RTX 4090" in err  # the GPUs on offer are named


def _post(client, token, url, body=None, key=None, method="post"):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if key:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    if method == "get":
        return client.get(url, **extra)
    return getattr(client, method)(url, data=json.dumps(body or {}), content_type="application/json", **extra)


def test_api_and_page_refuse_with_the_same_message_and_secrets_are_not_replayed(client, catalog, customer,
                                                                                 settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    now = timezone.now()
    lease = active_lease(customer, now)
    balance_top_up(customer=customer, amount_cents=1_000_000, now=now)
    token = api_token_create(customer=customer, name="t", scopes=("read", "order", "manage", "pay"))[1]
    far = _post(client, token, "/api/v1/volumes", {"site": "PDX-1", "size_tb": 1, "name": "far"}).json()
    api = _post(client, token, f"/api/v1/volumes/{far['id']}/attach", {"lease": lease.pk})
    client.force_login(customer)
    page = client.post(f"/storage/mine/volumes/{far['id']}/attach/", {"lease": lease.pk}, follow=True)
    shown = [str(m) for m in page.context["messages"]]
    assert api.status_code == 409 and api.json()["message"] in shown and "PDX-1" in api.json()["message"]

    account = _post(client, token, "/api/v1/object-storage", {"site": "DFW-1", "quota_gb": 5}).json()
    first = _post(client, token, f"/api/v1/object-storage/{account['id']}/keys", key="one-key")
    again = _post(client, token, f"/api/v1/object-storage/{account['id']}/keys", key="one-key")
    assert first.status_code == 201 and first.json()["secret_key"]
    assert again.status_code == 409 and again.json()["error"] == "secret_shown_once"
    assert S3Key.objects.filter(account_id=account["id"]).count() == 1
    assert first.json()["secret_key"].encode() not in b"".join(
        bytes(r.body) for r in IdempotentRequest.objects.all())

    unpaid = _post(client, token, "/api/v1/orders", {"offer": "rtx-3090", "site": "DFW-1", "term": "week",
                                                      "ssh_key": KEY}).json()
    paid = _post(client, token, f"/api/v1/invoices/{unpaid['invoice']['id']}/pay", key="pay-once")
    assert paid.status_code == 200 and paid.json()["state"] == "paid"
    assert _post(client, token, f"/api/v1/invoices/{unpaid['invoice']['id']}/pay", key="pay-once").content \
        == paid.content
    assert Lease.objects.get(pk=unpaid["lease"]["id"]).state != "pending"
    assert _post(client, token, "/api/v1/webhook", method="get").status_code == 404
    assert Site.objects.filter(code="PDX-1").exists()
