"""API token scopes (read; order; pay for paying from the balance and
refunds), tokens revoked when the password changes, Cache-Control: no-store on signed-in
pages (and the page that shows a new token), Permissions-Policy everywhere, and a Secure
language cookie in production."""
import json
import os
import re
import subprocess
import sys

import pytest
from django.contrib.auth.hashers import make_password
from django.urls import reverse
from django.utils import timezone

from billing.services import balance_top_up
from inventory.models import AuditEntry
from rental.accounts.services import api_token_create
from rental.models import ApiToken
from tests.factories import ED25519, place
from tests.security.helpers import ROOT, TEST_ONLY_ENV

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery 9"
ORDER = {"offer": "rtx-3090", "site": "DFW-1", "term": "week", "ssh_key": ED25519}


def call(client, method, url, raw, body=None):
    kwargs = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    if method == "post":
        return client.post(url, data=json.dumps(body or {}), content_type="application/json", **kwargs)
    return client.get(url, **kwargs)


@pytest.fixture
def funded(catalog, customer):
    balance_top_up(customer=customer, amount_cents=1_000_00, now=timezone.now())
    return customer


def test_a_read_token_reads_and_cannot_order_or_refund(client, funded):
    lease, _ = place(funded, pay=True)
    raw = api_token_create(customer=funded, name="dashboard", scopes=["read"])[1]
    assert call(client, "get", reverse("api_leases"), raw).status_code == 200
    assert call(client, "get", reverse("api_lease", args=[lease.pk]), raw).status_code == 200
    response = call(client, "post", reverse("api_orders"), raw, ORDER)
    assert response.status_code == 403 and response.json() == {**response.json(), "error": "insufficient_scope",
                                                                "scope": "order"}
    response = call(client, "post", reverse("api_lease_refund", args=[lease.pk]), raw)
    assert response.status_code == 403 and response.json()["scope"] == "pay"
    lease.refresh_from_db()
    assert lease.state != "cancelled"


def test_an_order_token_orders_unpaid_but_cannot_spend_the_balance(client, funded):
    raw = api_token_create(customer=funded, name="ci", scopes=["order"])[1]
    assert call(client, "get", reverse("api_leases"), raw).status_code == 403  # no read
    assert call(client, "post", reverse("api_orders"), raw, ORDER).status_code == 201
    response = call(client, "post", reverse("api_orders"), raw, {**ORDER, "pay_from_balance": True})
    assert response.status_code == 403 and response.json()["scope"] == "pay"


def test_a_full_token_pays_and_refunds(client, funded):
    raw = api_token_create(customer=funded, name="all", scopes=["read", "order", "pay"])[1]
    response = call(client, "post", reverse("api_orders"), raw, {**ORDER, "pay_from_balance": True})
    assert response.status_code == 201
    lease_id = response.json()["lease"]["id"]
    assert call(client, "post", reverse("api_lease_refund", args=[lease_id]), raw).status_code == 200


def test_the_settings_form_makes_read_only_tokens_by_default(client, customer):
    client.force_login(customer)
    response = client.post(reverse("token_create"), {"name": "plain"}, follow=True)  # shown after a redirect
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    assert ApiToken.objects.get(name="plain").scopes == "read"
    client.post(reverse("token_create"), {"name": "buyer", "scopes": ["read", "order"]})
    assert ApiToken.objects.get(name="buyer").scopes == "read order"
    assert ApiToken.objects.get(name="buyer").scopes in client.get(reverse("account_settings")).content.decode()


def test_changing_the_password_revokes_every_token(client, customer):
    raws = [api_token_create(customer=customer, name=f"t{n}")[1] for n in range(2)]
    client.force_login(customer)
    response = client.post(reverse("password_change"), {"old_password": PASSWORD, "new_password1": "brand new pass 8817",
                                                        "new_password2": "brand new pass 8817"})
    assert response.status_code == 302
    for raw in raws:
        assert call(client, "get", reverse("api_leases"), raw).status_code == 401
    assert not ApiToken.objects.filter(revoked_at__isnull=True).exists()
    assert AuditEntry.objects.filter(action="api_tokens_revoke_all", detail__count=2).exists()


def test_a_password_hash_upgrade_at_login_revokes_nothing(client, customer, settings):
    """Logging in may rehash the same password (a new hasher); that is not a change."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher",
                                 "django.contrib.auth.hashers.MD5PasswordHasher"]
    type(customer).objects.filter(pk=customer.pk).update(
        password=make_password(PASSWORD, hasher="md5"))
    raw = api_token_create(customer=customer, name="keep")[1]
    assert client.post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 302
    customer.refresh_from_db()
    assert customer.password.startswith("pbkdf2_sha256$")  # it was upgraded
    assert call(client, "get", reverse("api_leases"), raw).status_code == 200


def test_signed_in_pages_are_no_store_and_public_ones_carry_permissions_policy(client, alices, customer):
    for url in ("/", "/gpus/", reverse("login")):
        response = client.get(url)
        if url != reverse("login"):  # Django's login view is never_cache anyway
            assert "no-store" not in response.get("Cache-Control", ""), url
        assert "camera=()" in response["Permissions-Policy"] and "payment=()" in response["Permissions-Policy"]
    client.force_login(customer)
    for url in ("/", reverse("lease_list"), reverse("lease_detail", args=[alices["lease"].pk]),
                reverse("billing:invoices"), reverse("billing:balance"), reverse("account_settings"),
                reverse("recovery_codes")):
        response = client.get(url)
        assert response["Cache-Control"] == "no-store", url
        assert "geolocation=()" in response["Permissions-Policy"], url
    api = client.get(reverse("api_leases"), HTTP_AUTHORIZATION="Bearer " + api_token_create(
        customer=customer, name="x")[1])
    assert api["Cache-Control"] == "no-store"


def test_production_language_cookie_is_secure():
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env.update(DEBUG="0", SECRET_KEY="s" * 60, DJANGO_SETTINGS_MODULE="storefront.settings", ALLOWED_HOSTS="shop.example",
               DATABASE_URL="postgres://shop@127.0.0.1:5432/shop")  # production refuses to start without them
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.LANGUAGE_COOKIE_SECURE, s.LANGUAGE_COOKIE_HTTPONLY, bool(s.PERMISSIONS_POLICY))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr[-500:]


def test_the_language_cookie_is_sent_secure_when_set(client, settings):
    settings.LANGUAGE_COOKIE_SECURE = True
    response = client.post(reverse("set_language"), {"language": "zh-hans", "next": "/"})
    cookie = response.cookies[settings.LANGUAGE_COOKIE_NAME]
    assert cookie["secure"] is True and re.match(r"zh-hans", cookie.value)
