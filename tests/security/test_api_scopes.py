"""Every /api/v1 route checks the scope it declares: the URLconf is walked at run time (a
route added later without a declared scope fails here), each route and method is called
with a token of every single scope and with one of every scope but the right one, and
docs/API.md's route table must be the one the code declares."""
import json
import re
from pathlib import Path

import pytest
from django.test import override_settings
from django.urls import path

from billing.services import checkout_place_order
from inventory.models import Offer, Site
from rental.accounts.services import api_token_create, ssh_key_add
from rental.api import api_endpoint
from rental.models import ApiScope, Image
from storefront.api_routes import api_routes, scope_table

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
SCOPES = list(ApiScope.values)
DOCUMENTED_ANSWERS = {200, 201, 202, 400, 402, 404, 409}  # what a right-scoped call may get


@pytest.fixture
def objects(catalog, customer, settings):
    settings.API_REQUESTS_PER_IP_PER_MINUTE = settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 10**6
    lease, invoice = checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="DFW-1"),
        term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=ED25519)
    key = ssh_key_add(customer=customer, name="k", public_key=ED25519)
    return {"lease_id": lease.pk, "invoice_id": invoice.pk, "key_id": key.pk, "action": "restart",
            "rest": "no-such-endpoint",
            # storage, quotes and webhook deliveries: none exist, so a right-scoped call is a 404
            "volume_id": 10**6, "snapshot_id": 10**6, "account_id": 10**6, "quote_id": 10**6, "delivery_id": 10**6,
            # the workbench's registry credentials and account variables: none exist either
            "credential_id": 10**6, "name": "NO_SUCH_VARIABLE",
            "member_id": 10**6, "invitation_id": 10**6}  # teams: none in the team


def concrete(route: str, values: dict) -> str:
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(values[m.group(1)]), route)


def call(client, method, url, raw_token=None):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {raw_token}"} if raw_token else {}
    if method == "GET":
        return client.get(url, **extra)
    return client.generic(method, url, data="{}", content_type="application/json", **extra)


def undeclared(routes) -> list[str]:
    return [r.route for r in routes if not r.scopes or any(s not in (None, *SCOPES) for s in r.scopes.values())]


def test_every_api_route_declares_a_known_scope_for_each_method(db):
    routes = api_routes()
    assert len(routes) >= 20  # the walk found the API, not an empty list
    assert undeclared(routes) == []


def test_a_route_without_a_declared_scope_is_caught(db):
    def bare(request):  # a view added without api_endpoint
        return None

    @api_endpoint("GET", scope="read")
    def declared(request):
        return None

    urlconf = type("urls", (), {"urlpatterns": [path("api/v1/new", bare), path("api/v1/ok", declared)]})
    with override_settings(ROOT_URLCONF=urlconf):
        assert undeclared(api_routes()) == ["api/v1/new"]


def test_every_route_refuses_every_wrong_scope_and_serves_the_right_one(client, customer, objects):
    single = {scope: api_token_create(customer=customer, name=scope, scopes=[scope])[1] for scope in SCOPES}
    checked = 0
    for route in api_routes():
        url = concrete(route.route, objects)
        for method, needed in route.scopes.items():
            if needed is None:  # public: no token needed, and any token is fine
                for raw in (None, *single.values()):
                    response = call(client, method, url, raw)
                    assert response.status_code in DOCUMENTED_ANSWERS, (method, url, response.content)
                continue
            assert call(client, method, url).status_code == 401, (method, url)
            others = [s for s in SCOPES if s != needed]
            all_but = api_token_create(customer=customer, name="all-but", scopes=others)
            for raw in [single[s] for s in others] + [all_but[1]]:
                response = call(client, method, url, raw)
                assert response.status_code == 403, (method, url, response.content)
                assert response.json() == {**response.json(), "error": "insufficient_scope", "scope": needed}
            all_but[0].delete()
            response = call(client, method, url, single[needed])
            assert response.status_code in DOCUMENTED_ANSWERS, (method, url, needed, response.content)
            assert response.json().get("error") != "insufficient_scope"
            checked += 1
    assert checked >= 18


@pytest.mark.parametrize("action", ["stop", "start", "restart"])
def test_an_order_only_token_cannot_control_instances(client, customer, objects, action):
    order_only = api_token_create(customer=customer, name="ci", scopes=["order"])[1]
    lease = objects["lease_id"]
    for url, body in [(f"/api/v1/leases/{lease}/{action}", {}), (f"/api/v1/leases/{lease}/restore", {"snapshot": 1}),
                      (f"/api/v1/leases/{lease}/auto-renew", {"auto_renew": False})]:
        response = client.post(url, json.dumps(body), content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {order_only}")
        assert response.status_code == 403 and response.json()["scope"] == "manage", url


def test_turning_auto_renew_on_spends_the_balance_so_it_needs_pay_too(client, customer, objects):
    manage = api_token_create(customer=customer, name="m", scopes=["manage"])[1]
    url = f"/api/v1/leases/{objects['lease_id']}/auto-renew"
    post = lambda value: client.post(url, json.dumps({"auto_renew": value}), content_type="application/json",  # noqa: E731
                                     HTTP_AUTHORIZATION=f"Bearer {manage}")
    assert post(True).json()["scope"] == "pay" and post(None).json()["scope"] == "pay"
    assert post(False).status_code == 200


def test_replies_leave_out_the_connection_details_without_read(client, catalog, customer, objects):
    from django.utils import timezone

    from rental.models import Lease

    now = timezone.now()
    Lease.objects.filter(pk=objects["lease_id"]).update(host="203.0.113.7", ssh_port=2201, state="active",
                                                         started_at=now, ends_at=now + timezone.timedelta(days=7))
    order_only = api_token_create(customer=customer, name="o", scopes=["order", "manage"])[1]
    reader = api_token_create(customer=customer, name="r", scopes=["read"])[1]
    url = f"/api/v1/leases/{objects['lease_id']}/auto-renew"
    answer = client.post(url, json.dumps({"auto_renew": False}), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {order_only}").json()
    assert answer["id"] == objects["lease_id"] and "ssh" not in answer and "203.0.113.7" not in json.dumps(answer)
    shown = client.get(f"/api/v1/leases/{objects['lease_id']}", HTTP_AUTHORIZATION=f"Bearer {reader}").json()
    assert shown["ssh"]["host"] == "203.0.113.7" and shown["ssh"]["port"] == 2201 and "events" in shown


def test_the_docs_table_is_the_one_the_code_declares(db):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "API.md").read_text()
    table = doc.split("<!-- route-scope-table:start -->\n", 1)[1].split("<!-- route-scope-table:end -->", 1)[0]
    assert table == scope_table(), "regenerate it: DEBUG=1 python -m storefront.api_routes"


def test_the_migration_gives_manage_only_to_tokens_that_held_every_other_scope(customer):
    import importlib

    from django.apps import apps

    from rental.models import ApiToken

    migration = importlib.import_module("rental.migrations.0015_apitoken_manage_scope")
    made = {scopes: api_token_create(customer=customer, name=scopes, scopes=scopes.split())[0]
            for scopes in ("read order pay", "order", "read order", "order pay", "read")}
    ApiToken.objects.filter(pk=made["read order pay"].pk).update(scopes="read order pay")  # as stored before
    migration.grant_manage_to_full_tokens(apps, None)
    after = {name: ApiToken.objects.get(pk=token.pk).scopes for name, token in made.items()}
    assert after == {"read order pay": "read order manage pay", "order": "order", "read order": "read order",
                     "order pay": "order pay", "read": "read"}
