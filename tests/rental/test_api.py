"""The JSON API: token auth, the customer's own objects only, JSON errors with 4xx, orders,
refunds and the OpenAPI schema."""
import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice
from billing.services import balance_top_up, checkout_place_order
from inventory.models import GpuSlot, Offer, Site
from rental.accounts.services import api_token_create, api_token_revoke
from rental.models import Image, Lease, LeaseState
from tests.rental.helpers import ED25519, call, order_body

RSA_1024 = ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCs1iItVMMkozv8h0hXHAj1f4bMSlqWGrW8aR9KdoVYT4aLyj2AinTDtzQ9V0Q0PWNkS"
            "nR85JqNDk7omlrz8O/T/Li44KklZPxiGC4Ydsw7N4ylKMoHdtxZSReL2fsxnZsCE6/xDxXkyL+tITndnau64Fs2g+XQ9E7pSbKlddByMQ==")


@pytest.fixture
def token(customer):
    return api_token_create(customer=customer, name="test")[1]


@pytest.fixture
def other_token(other_customer):
    return api_token_create(customer=other_customer, name="bob")[1]


def place(customer):
    return checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                site=Site.objects.get(code="DFW-1"), term="week",
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=ED25519)


def test_offers_are_public_with_cents_usd_and_free_per_site(client, catalog):
    response = client.get("/api/v1/offers")
    offers = {o["slug"]: o for o in response.json()["offers"]}
    assert response.status_code == 200
    h100 = offers["h100-sxm"]
    assert h100["weekly_cents"] == 47500 and h100["weekly_usd"] == "475.00"
    assert h100["per_gpu_hour_cents"] == 235 and h100["per_gpu_hour_usd"] == "2.35"
    assert sum(h100["free_by_site"].values()) == h100["free_total"] > 0


@pytest.mark.parametrize("auth", [None, "Bearer nope", "Bearer gpr_wrong", "Basic abc"])
def test_missing_or_bad_token_is_401_json(client, db, auth):
    extra = {"HTTP_AUTHORIZATION": auth} if auth else {}
    response = client.get("/api/v1/leases", **extra)
    assert response.status_code == 401 and response.json()["error"] == "unauthorized"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_revoked_token_is_401(client, customer, token):
    api_token_revoke(customer=customer, token_id=customer.api_tokens.get().pk)
    assert call(client, "get", "/api/v1/leases", token).status_code == 401


def test_order_via_api_then_list_get_and_invoice(client, catalog, customer, token):
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    response = call(client, "post", "/api/v1/orders", token, order_body(pay_from_balance=True))
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["lease"]["state"] == "provisioning" and data["lease"]["image"] == "pytorch-2.5-cuda-12.4"
    assert data["invoice"]["state"] == "paid" and data["invoice"]["amount_cents"] == 6500 + 210
    assert len(data["invoice"]["lines"]) == 2
    lease_id, invoice_id = data["lease"]["id"], data["invoice"]["id"]
    assert [row["id"] for row in call(client, "get", "/api/v1/leases", token).json()["leases"]] == [lease_id]
    detail = call(client, "get", f"/api/v1/leases/{lease_id}", token).json()
    assert [e["kind"] for e in detail["events"]] == ["created", "paid"]
    assert call(client, "get", f"/api/v1/invoices/{invoice_id}", token).json()["amount_usd"] == "67.10"


def test_other_customers_objects_are_404(client, catalog, customer, other_token):
    lease, invoice = place(customer)
    for url in (f"/api/v1/leases/{lease.pk}", f"/api/v1/invoices/{invoice.pk}"):
        response = call(client, "get", url, other_token)
        assert response.status_code == 404 and response.json()["error"] == "not_found"
    assert call(client, "post", f"/api/v1/leases/{lease.pk}/refund", other_token).status_code == 404
    assert call(client, "get", "/api/v1/leases", other_token).json()["leases"] == []
    lease.refresh_from_db()
    assert lease.state == LeaseState.PENDING


@pytest.mark.parametrize("raw, error", [("{nope", "bad_json"), ("[1, 2]", "bad_json"), ("", "bad_json"),
                                        (b"\xff\xfe", "bad_json")])
def test_bad_json_is_400(client, catalog, token, raw, error):
    response = call(client, "post", "/api/v1/orders", token, raw=raw)
    assert response.status_code == 400 and response.json()["error"] == error


@pytest.mark.parametrize("overrides, field", [
    ({"offer": "no-such-card"}, "offer"), ({"offer": None}, "offer"), ({"site": "MARS-1"}, "site"),
    ({"term": "year"}, "term"), ({"ssh_key": RSA_1024}, "ssh_key"), ({"ssh_key": 42}, "ssh_key"),
    ({"image": "pytorch-2.5-rocm-6.4"}, "image"), ({"addons": {"extra_nvme_tb": 99}}, "addons.extra_nvme_tb"),
    ({"addons": {"gpu_tb": 1}}, "addons"), ({"addons": [1]}, "addons"),
    ({"addons": {"snapshot_tb": -1}}, "addons.snapshot_tb"), ({"pay_from_balance": "yes"}, "pay_from_balance"), ({"addons": {"snapshot_tb": "x"}}, "addons.snapshot_tb"),
])
def test_field_errors_name_the_field_and_create_nothing(client, catalog, token, overrides, field):
    response = call(client, "post", "/api/v1/orders", token, order_body(**overrides))
    assert response.status_code == 400 and field in response.json()["fields"], response.json()
    assert not Lease.objects.exists() and not Invoice.objects.exists()


def test_snapshot_addon_is_refused_by_name_and_charges_nothing(client, catalog, customer, token):
    """Snapshots are taken from a running lease, not bought with the order: a request that
    still asks for snapshot TB is a 400 naming addons.snapshot_tb, and nothing is created."""
    balance_top_up(customer=customer, amount_cents=10_000, now=timezone.now())
    response = call(client, "post", "/api/v1/orders", token,
                    order_body(addons={"extra_nvme_tb": 1, "snapshot_tb": 1}, pay_from_balance=True))
    body = response.json()
    assert response.status_code == 400 and body["error"] == "invalid"
    assert list(body["fields"]) == ["addons.snapshot_tb"]
    assert "no longer an order add-on" in body["fields"]["addons.snapshot_tb"][0]
    assert not Lease.objects.exists() and not Invoice.objects.exists()
    assert call(client, "get", "/api/v1/account", token).json()["balance_cents"] == 10_000


def test_snapshot_addon_zero_from_an_old_client_orders_without_it(client, catalog, customer, token):
    response = call(client, "post", "/api/v1/orders", token, order_body(addons={"extra_nvme_tb": 1, "snapshot_tb": 0}))
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["invoice"]["amount_cents"] == 6500 + 210 and len(data["invoice"]["lines"]) == 2
    assert data["lease"]["addons"] == {"extra_nvme_tb": 1, "network_volume_tb": 0, "snapshot_tb": 0}


def test_schema_marks_the_snapshot_addon_retired(client, db):
    schemas = client.get("/api/v1/schema").json()["components"]["schemas"]
    assert schemas["Addons"]["properties"]["snapshot_tb"]["const"] == 0
    assert schemas["Addons"]["properties"]["snapshot_tb"]["deprecated"] is True
    assert schemas["LeaseAddons"]["properties"]["snapshot_tb"]["readOnly"] is True


def test_sold_out_is_409_and_nothing_created(client, catalog, other_customer, token):
    offer = Offer.objects.get(slug="8x-mi300x")
    GpuSlot.objects.filter(node__gpu_model=offer.gpu_model).exclude(node__site__code="DFW-1").update(in_service=False)
    balance_top_up(customer=other_customer, amount_cents=400_000, now=timezone.now())
    checkout_place_order(customer=other_customer, offer=offer, site=Site.objects.get(code="DFW-1"), term="week",
                         image=Image.objects.get(slug="pytorch-2.5-rocm-6.4"), ssh_public_key=ED25519,
                         pay_from_balance=True)  # an unpaid order may not take a whole SKU
    response = call(client, "post", "/api/v1/orders", token, order_body(offer="8x-mi300x", addons={}))
    assert response.status_code == 409 and response.json()["error"] == "sold_out"
    assert Lease.objects.count() == 1 and Invoice.objects.count() == 1


def test_insufficient_balance_is_402_and_nothing_created(client, catalog, token):
    response = call(client, "post", "/api/v1/orders", token, order_body(pay_from_balance=True))
    assert response.status_code == 402 and response.json()["error"] == "insufficient_balance"
    assert not Lease.objects.exists()


def test_body_over_64_kb_is_413(client, catalog, token):
    body = order_body(ssh_key="x" * 70_000)
    response = call(client, "post", "/api/v1/orders", token, body)
    assert response.status_code == 413 and response.json()["error"] == "too_large"


def test_wrong_method_is_405_and_unknown_path_404(client, db, token):
    response = call(client, "get", "/api/v1/orders", token)
    assert response.status_code == 405 and response.json()["error"] == "method_not_allowed"
    assert response["Allow"] == "POST"
    assert call(client, "delete", "/api/v1/offers").status_code == 405
    response = client.get("/api/v1/nothing/here")
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    assert client.get("/api/v1/leases/abc").status_code == 404


def test_refund_via_api_within_the_hour_and_refused_after(client, catalog, customer, token):
    balance_top_up(customer=customer, amount_cents=20_000, now=timezone.now())
    first = call(client, "post", "/api/v1/orders", token, order_body(pay_from_balance=True)).json()["lease"]["id"]
    response = call(client, "post", f"/api/v1/leases/{first}/refund", token)
    assert response.status_code == 200 and response.json()["refunded_cents"] == 6710
    assert response.json()["lease"]["state"] == "cancelled"
    second = call(client, "post", "/api/v1/orders", token, order_body(pay_from_balance=True)).json()["lease"]["id"]
    Lease.objects.filter(pk=second).update(created_at=timezone.now() - timedelta(hours=2))
    response = call(client, "post", f"/api/v1/leases/{second}/refund", token)
    assert response.status_code == 409 and response.json()["error"] == "refund_refused"
    assert "within 60 minutes" in response.json()["message"]


def test_api_ignores_session_and_csrf(client, catalog, customer):
    client.force_login(customer)
    assert client.get("/api/v1/leases").status_code == 401
    csrf_client = client.__class__(enforce_csrf_checks=True)
    assert call(csrf_client, "post", "/api/v1/orders", None, order_body()).status_code == 401


def test_schema_is_openapi_listing_every_path(client, db):
    response = client.get(reverse("api_schema"))
    schema = json.loads(response.content)
    assert response.status_code == 200 and schema["openapi"].startswith("3.1")
    assert {"/api/v1/offers", "/api/v1/orders", "/api/v1/leases", "/api/v1/leases/{id}",
            "/api/v1/leases/{id}/refund", "/api/v1/invoices/{id}", "/api/v1/schema"} <= set(schema["paths"])
    refs = json.dumps(schema).split('"$ref": "#/components/schemas/')[1:]
    assert all(ref.split('"')[0] in schema["components"]["schemas"] for ref in refs)


def test_schema_merges_sizing_paths_when_present(client, db):
    pytest.importorskip("sizing.api_schema")
    from sizing.api_schema import PATHS

    assert set(PATHS) <= set(client.get(reverse("api_schema")).json()["paths"])
