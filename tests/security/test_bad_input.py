"""Bad input never gets a 500. Hypothesis throws random values — unicode, NULs, huge and
negative numbers, very long strings, repeated and unknown fields — at every form: the
catalog filter, signup, login, the order form, settings, API token creation, top-up, the
calculator, SLA claims and the two-factor code; each answer is < 500. Then the API's
guards: bodies over 64 KB are 413, malformed JSON and non-objects are 400. (The sizing
engine's own properties: tests/sizing/engine/test_properties.py; schemathesis over the whole
API: tests/security/test_api_fuzz.py.)"""
import json
import os

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rental.accounts.services import api_token_create
from tests.otp import TwoFactorClient

pytestmark = pytest.mark.django_db
EXAMPLES = int(os.environ.get("FORM_FUZZ_EXAMPLES", "40"))
fuzz = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=300)
value = st.one_of(
    text, st.just(""), st.just("\x00"), st.integers().map(str), st.floats(allow_nan=True).map(str),
    st.sampled_from(["-1", "0", "1e309", "NaN", "Infinity", "9" * 400, "0x1f", " 40 ", "DFW-1", "week", "month",
                     "nvidia", "llama-2-13b", "lora", "on", "true", "<script>alert(1)</script>", "' OR 1=1 --",
                     "../../etc/passwd", "a" * 5000, "ssh-ed25519 AAAA", "２４", "١٢"]))


def form(*fields):
    """Random values for the named fields, some left out, plus unknown extras."""
    return st.fixed_dictionaries({}, optional={f: st.one_of(value, st.lists(value, max_size=3)) for f in fields}) \
        .flatmap(lambda d: st.dictionaries(text.filter(bool), value, max_size=2).map(lambda extra: {**extra, **d}))


def never_500(response, what):
    assert response.status_code < 500, (what, response.status_code, response.content[:300])


@pytest.fixture
def signed_in(catalog, customer):
    client = Client()
    client.force_login(customer)
    return client


CATALOG = ("min_vram", "vendor", "link", "site", "max_price", "in_stock")
SIZING = ("model", "method", "seq", "batch", "gpus", "zero", "checkpointing", "flash_attention", "params_b",
          "layers", "hidden", "heads", "kv_heads", "vocab", "rank", "site", "vendor", "in_stock", "config")
ORDER = ("site", "term", "image", "ssh_public_key", "extra_nvme_tb", "network_volume_tb",
         "pay_from_balance")


@fuzz
@given(data=form(*CATALOG), htmx=st.booleans())
def test_catalog_filter(catalog, data, htmx):
    never_500(Client().get(reverse("catalog"), data, HTTP_HX_REQUEST="true" if htmx else None), data)


@fuzz
@given(data=form(*SIZING), htmx=st.booleans())
def test_calculator(catalog, data, htmx):
    client = Client()
    never_500(client.get(reverse("sizing"), data, **({"HTTP_HX_REQUEST": "true"} if htmx else {})), data)
    never_500(client.get(reverse("api_estimate"), data), data)


@fuzz
@given(data=form("username", "password1", "password2", "email"))
def test_signup(db, data):
    never_500(Client().post(reverse("signup"), data), data)


@fuzz
@given(data=form("username", "password"))
def test_login(db, data):
    never_500(Client().post(reverse("login"), data), data)


@fuzz
@given(data=form(*ORDER), slug=st.sampled_from(["rtx-3090", "h100-sxm-8x", "nope", "a" * 60]))
def test_order_form(signed_in, data, slug):
    never_500(signed_in.get(reverse("order", args=[slug]), data), ("GET", data))
    never_500(signed_in.post(reverse("order", args=[slug]), data), ("POST", data))


@fuzz
@given(data=form("email", "auto_renew", "language"), token=form("name"), topup=form("amount"))
def test_settings_token_and_top_up(signed_in, data, token, topup):
    never_500(signed_in.post(reverse("account_settings"), data), data)
    never_500(signed_in.post(reverse("token_create"), token), token)
    never_500(signed_in.post(reverse("billing:balance"), topup), topup)


@fuzz
@given(data=form("lease", "period", "message"))
def test_sla_claim(signed_in, data):
    never_500(signed_in.post(reverse("sla:claims"), data), data)


@fuzz
@given(data=form("code", "next"))
def test_two_factor_code(catalog, operator, data):
    client = TwoFactorClient()
    client.force_login(operator)
    never_500(client.post(reverse("otp_setup"), data), data)
    never_500(client.post(reverse("otp_verify"), data), data)


# --- the API's guards -------------------------------------------------------------------------

@pytest.fixture
def bearer(catalog, customer):
    return {"HTTP_AUTHORIZATION": "Bearer " + api_token_create(customer=customer, name="t")[1]}


def test_oversized_bodies_are_413(client, bearer):
    big = json.dumps({"offer": "rtx-3090", "ssh_key": "x" * (65 * 1024)})
    for url in (reverse("api_orders"), reverse("api_estimate") + "?method=lora"):
        response = client.post(url, data=big, content_type="application/json", **bearer)
        assert response.status_code == 413 and response.json()["error"] == "too_large", url


def test_a_body_larger_than_announced_is_413(client, bearer):
    body = json.dumps({"offer": "rtx-3090", "pad": "y" * (70 * 1024)}).encode()
    response = client.generic("POST", reverse("api_orders"), body, content_type="application/json",
                              CONTENT_LENGTH="10", **bearer)
    assert response.status_code in (400, 413)


@pytest.mark.parametrize("body", [b"{", b"not json", b"[1, 2]", b'"a string"', b"null", b"\xff\xfe", b'{"offer": }',
                                  b'{"offer": "rtx-3090", "addons": [1]}', b'{"offer": 5}', b"[" * 10000])
def test_malformed_json_is_a_4xx(client, bearer, body):
    response = client.post(reverse("api_orders"), data=body, content_type="application/json", **bearer)
    assert 400 <= response.status_code < 500, (body[:20], response.status_code)
    assert response.json()["error"]
    response = client.post(reverse("api_estimate") + "?method=lora", data=body, content_type="application/json")
    assert 400 <= response.status_code < 500, (body[:20], response.status_code)


@fuzz
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
                         lambda kids: st.lists(kids, max_size=4) | st.dictionaries(text, kids, max_size=4),
                         max_leaves=20),
       fields=form("offer", "site", "term", "ssh_key", "image", "pay_from_balance"))
def test_random_json_orders_are_4xx_or_created(bearer, body, fields):
    client, auth = Client(), bearer
    for payload in (body, fields):
        response = client.post(reverse("api_orders"), data=json.dumps(payload), content_type="application/json", **auth)
        assert response.status_code < 500 and response.status_code in (201, 400, 402, 409, 413), response.content[:300]


# --- Inputs that used to be 500s (run on PostgreSQL too: DATABASE_URL) ----------------

def test_a_nul_in_a_json_string_is_400(bearer, client):
    for body in ({"offer": "rtx\x00-3090"}, {"offer": "rtx-3090", "site": "DFW-1", "term": "week", "image": "x\x00"},
                 {"offer": "rtx-3090", "addons": {"extra_nvme_tb\x00": 1}}, {"offer": "rtx-3090", "x": ["a", ["\x00"]]}):
        response = client.post(reverse("api_orders"), data=json.dumps(body), content_type="application/json",
                               **bearer)
        assert response.status_code == 400 and response.json()["error"] == "bad_json", body


@pytest.mark.parametrize("depth", [21, 1000, 8000])  # 8,000 levels still fit in 64 KB
def test_deeply_nested_json_is_400(bearer, client, depth):
    for body in ('{"offer": ' + "[" * depth + "]" * depth + "}", '{"a": ' * depth + "1" + "}" * depth):
        response = client.post(reverse("api_orders"), data=body, content_type="application/json", **bearer)
        assert response.status_code == 400 and response.json()["error"] == "bad_json", depth


def test_json_as_deep_as_allowed_still_reaches_the_fields(bearer, client):
    body = {"offer": "rtx-3090", "pad": [[[[1]]]]}
    response = client.post(reverse("api_orders"), data=json.dumps(body), content_type="application/json", **bearer)
    assert response.status_code == 400 and response.json()["error"] == "invalid"  # site/term missing, not bad_json


@pytest.fixture
def staff(operator):
    client = TwoFactorClient()
    client.force_login(operator)
    return client


def test_an_export_period_past_year_2999_is_a_clear_error(staff):
    for date_from, date_to in (("2025-01-01", "9999-12-31"), ("0001-01-01", "2025-01-01"), ("9999-12-31", "9999-12-31")):
        response = staff.get(reverse("admin:ops_exports"), {"what": "leases", "date_from": date_from,
                                                            "date_to": date_to})
        assert response.status_code == 200 and not response.streaming, (date_from, date_to)
        assert "Dates must be between" in response.content.decode()


@pytest.mark.parametrize("query", ["state=%00", "q=%00", "site__id__exact=%00", "state=a%00b", "%00=1",
                                   "deadline=%00", "o=%00", "p=%00"])
def test_a_nul_in_an_admin_changelist_query_is_400(staff, alices, query):
    for changelist in ("/admin/rental/lease/", "/admin/billing/invoice/", "/admin/auth/user/"):
        response = staff.get(f"{changelist}?{query}")
        assert response.status_code == 400, (changelist, query, response.status_code)


def test_a_nul_in_a_posted_form_is_400(signed_in):
    response = signed_in.post(reverse("account_settings"), {"email": "a\x00@example.org"})
    assert response.status_code == 400


@fuzz
@given(params=st.dictionaries(st.sampled_from(["state", "site", "offer", "term", "q", "o", "deadline", "p",
                                               "created_at__gte", "customer__id__exact", "e"]),
                              value, min_size=1, max_size=3))
def test_admin_changelist_filters(staff, params):
    for changelist in ("/admin/rental/lease/", "/admin/billing/invoice/", "/admin/inventory/node/"):
        never_500(staff.get(changelist, params), (changelist, params))
