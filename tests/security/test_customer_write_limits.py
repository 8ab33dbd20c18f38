"""Every customer-triggered call is rate limited, answering 429 with Retry-After: the
public sizing API (/api/v1/estimate) counts against the API's per-address limit like every
other /api/v1 route, and every write a signed-in customer makes on the site's pages counts
against CUSTOMER_WRITES_PER_MINUTE — the pages whose actions call Ceph (snapshots, volumes,
S3 keys), a coin wallet (a payment address) or DNS (a webhook URL) among them; the URLconf
walk below finds any page added later."""
import json
import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db
CONFIG = json.dumps({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100})


def assert_limited(response, setting=None):
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= 60
    if setting:
        assert response.json()["error"] == "rate_limited" and response.json()["limit"] == setting


@pytest.mark.parametrize("same_client, other_client", [
    ("198.51.100.7", "198.51.100.8"),
    ("2001:db8:1:2::1", "2001:db8:1:3::1"),     # an IPv6 client is its /64
])
def test_the_sizing_api_shares_the_apis_per_address_limit(client, catalog, settings, same_client, other_client):
    settings.API_REQUESTS_PER_IP_PER_MINUTE = 3
    ipv6 = ":" in same_client
    assert client.get("/api/v1/estimate?model=llama-2-7b&method=qlora", REMOTE_ADDR=same_client).status_code == 200
    assert client.post("/api/v1/estimate?method=qlora", CONFIG, content_type="application/json",
                       REMOTE_ADDR=same_client.replace("::1", "::2") if ipv6 else same_client).status_code == 200
    assert client.get("/api/v1/offers", REMOTE_ADDR=same_client).status_code == 200   # one budget for the API
    assert_limited(client.get("/api/v1/estimate?model=llama-2-7b&method=qlora",
                              REMOTE_ADDR=same_client.replace("::1", "::3") if ipv6 else same_client),
                   "API_REQUESTS_PER_IP_PER_MINUTE")
    assert_limited(client.post("/api/v1/estimate?method=qlora", CONFIG, content_type="application/json",
                               REMOTE_ADDR=same_client), "API_REQUESTS_PER_IP_PER_MINUTE")
    assert client.get("/api/v1/estimate?model=llama-2-7b&method=qlora", REMOTE_ADDR=other_client).status_code == 200


def test_a_customers_page_writes_are_limited_per_account(client, customer, other_customer, settings):
    from rental.models import ApiToken

    settings.CUSTOMER_WRITES_PER_MINUTE = 3
    client.force_login(customer)
    for n, address in enumerate(("198.51.100.1", "198.51.100.2", "198.51.100.3")):  # a new address: same count
        assert client.post("/account/tokens/", {"name": f"t{n}", "scopes": ["read"]},
                           REMOTE_ADDR=address).status_code in (200, 302)
    made = ApiToken.objects.filter(customer=customer).count()
    assert made == 3
    assert_limited(client.post("/account/tokens/", {"name": "t4", "scopes": ["read"]}, REMOTE_ADDR="198.51.100.4"))
    assert ApiToken.objects.filter(customer=customer).count() == made  # the view did not run
    assert client.get("/account/settings/").status_code == 200  # reading goes on
    client.force_login(other_customer)
    assert client.post("/account/notifications/read/", REMOTE_ADDR="198.51.100.4").status_code == 302


def _paths(patterns, prefix=""):
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _paths(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            yield "/" + re.sub(r"<(?:(\w+):)?\w+>", lambda m: "1" if m.group(1) == "int" else "x", route)


def test_every_page_a_customer_can_post_to_is_limited(client, customer, catalog, settings):
    """With the limit at 0 every signed-in customer's POST to a page is refused before its
    view runs — all of them, walked from the URLconf, not a list kept by hand. The API, the
    agents' API and the admin have limits of their own."""
    settings.CUSTOMER_WRITES_PER_MINUTE = 0
    client.force_login(customer)
    paths = sorted({p for p in _paths(get_resolver().url_patterns)
                    if not p.startswith(("/api/", "/agent/", "/admin/")) and "^" not in p})
    assert len(paths) > 40 and "/storage/mine/objects/1/keys/" in paths
    answers = {path: client.post(path).status_code for path in paths}
    assert {path for path, status in answers.items() if status != 429} == set(), answers


def test_staff_and_anonymous_forms_are_not_counted_here(client, operator, settings):
    settings.CUSTOMER_WRITES_PER_MINUTE = 0
    assert client.post("/accounts/login/", {"username": "nobody", "password": "x" * 12}).status_code == 200
    client.force_login(operator)
    assert client.post("/i18n/setlang/", {"language": "en", "next": "/"}).status_code == 302
