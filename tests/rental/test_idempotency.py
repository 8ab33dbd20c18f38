"""Exactly once over the API (rental.idempotency, ADR 0011): a write with an Idempotency-Key
runs once per account and key; a retry gets the first answer back and creates nothing;
the key with another request is refused; a refused order leaves nothing behind."""
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing.models import Invoice, LedgerEntry, Quote
from billing.services import account_for, balance_top_up
from rental.accounts.services import api_token_create
from rental.idempotency import IdempotentRequest
from rental.models import Lease, SshKey
from tests.billing.payments_helpers import offline_coins, set_rate
from tests.rental.helpers import ED25519, call, order_body

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _roomy_rate_limits(settings):
    settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 10_000
    settings.API_REQUESTS_PER_IP_PER_MINUTE = 10_000


@pytest.fixture
def token(customer):
    return api_token_create(customer=customer, name="test", scopes=("read", "order", "manage", "pay"))[1]


def post(client, token, url, body, key=None):
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return call(client, "post", url, token, body, **extra)


def test_the_same_order_twice_with_one_key_is_one_order(client, catalog, customer, token):
    first = post(client, token, "/api/v1/orders", order_body(), key="order-1")
    again = post(client, token, "/api/v1/orders", order_body(), key="order-1")
    assert first.status_code == again.status_code == 201
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert Lease.objects.filter(customer=customer).count() == 1
    assert Invoice.objects.filter(customer=customer).count() == 1
    # A JSON body counts by content, not by key order or spacing.
    reordered = json.dumps(dict(reversed(list(order_body().items()))), indent=3)
    replay = call(client, "post", "/api/v1/orders", token, raw=reordered, HTTP_IDEMPOTENCY_KEY="order-1")
    assert replay.status_code == 201 and replay.content == first.content


def test_a_used_key_with_another_body_or_route_is_refused(client, catalog, customer, token):
    assert post(client, token, "/api/v1/orders", order_body(), key="k").status_code == 201
    other = post(client, token, "/api/v1/orders", order_body(term="month"), key="k")
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    assert "new key" in other.json()["message"]
    elsewhere = post(client, token, "/api/v1/keys", {"name": "laptop", "public_key": ED25519}, key="k")
    assert elsewhere.status_code == 422 and not SshKey.objects.exists()
    assert Lease.objects.filter(customer=customer).count() == 1


def test_keys_are_per_account_and_expire(client, catalog, customer, other_customer, token, settings):
    other = api_token_create(customer=other_customer, name="bob")[1]
    assert post(client, token, "/api/v1/orders", order_body(), key="shared").status_code == 201
    assert post(client, other, "/api/v1/orders", order_body(), key="shared").status_code == 201
    assert Lease.objects.count() == 2
    # Another token of the same account shares the account's keys.
    second = api_token_create(customer=customer, name="ci", scopes=("read", "order"))[1]
    assert post(client, second, "/api/v1/orders", order_body(), key="shared")["Idempotent-Replayed"] == "true"
    record = IdempotentRequest.objects.get(customer=customer, key="shared")
    assert record.expires_at - record.created_at == timedelta(hours=settings.API_IDEMPOTENCY_KEY_HOURS)
    IdempotentRequest.objects.filter(pk=record.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    fresh = post(client, token, "/api/v1/orders", order_body(term="month"), key="shared")
    assert fresh.status_code == 201 and "Idempotent-Replayed" not in fresh
    assert Lease.objects.filter(customer=customer).count() == 2


def test_a_refused_request_keeps_no_key_and_bad_keys_are_refused(client, catalog, customer, token):
    bad = post(client, token, "/api/v1/orders", order_body(site="NOPE-1"), key="fix-me")
    assert bad.status_code == 400 and not IdempotentRequest.objects.exists()
    assert post(client, token, "/api/v1/orders", order_body(), key="fix-me").status_code == 201
    for key in ("", "x" * 256, "naïve"):
        response = post(client, token, "/api/v1/orders", order_body(), key=key)
        assert response.status_code == 400 and response.json()["error"] == "bad_idempotency_key"
    assert Lease.objects.filter(customer=customer).count() == 1


def test_an_order_with_a_coin_not_accepted_creates_nothing(client, catalog, customer, token):
    set_rate("LTC", "80", timezone.now())
    with offline_coins():
        refused = post(client, token, "/api/v1/orders", order_body(coin="BTC"), key="btc")
        assert refused.status_code == 400
        assert "LTC" in refused.json()["fields"]["coin"][0]  # names the coins that are accepted
        assert not Lease.objects.exists() and not Invoice.objects.exists()
        placed = post(client, token, "/api/v1/orders", order_body(coin="ltc"), key="btc")
        assert placed.status_code == 201
        quote = placed.json()["quote"]
        assert quote["coin"] == "LTC" and quote["invoice"] == placed.json()["invoice"]["id"]
        assert Quote.objects.get().address == quote["address"]


def test_an_order_whose_quote_is_refused_is_undone(client, catalog, customer, token):
    """The coin is accepted but no rate is set: the quote is refused inside the order's
    transaction, so the lease, its slots and the invoice are gone with it."""
    with offline_coins():
        refused = post(client, token, "/api/v1/orders", order_body(coin="LTC"), key="no-rate")
    assert refused.status_code == 409 and refused.json()["error"] == "quote_refused"
    assert "Nothing was ordered" in refused.json()["message"]
    assert not Lease.objects.exists() and not Invoice.objects.exists()
    assert not IdempotentRequest.objects.exists()


# --- the property: any sequence of retries and bodies -------------------------------------

BODIES = [order_body(pay_from_balance=True), order_body(pay_from_balance=True, term="month"),
          order_body(pay_from_balance=True, site="NOPE-1")]  # the last is refused (400)
_users = iter(range(10**6))


@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.sampled_from(range(len(BODIES)))),
                min_size=1, max_size=7))
def test_any_retries_charge_and_order_exactly_once(client, catalog, requests):
    """A model of the rule: a key's first successful request is done once, its answer
    replayed for the same body and refused for another; a refused request keeps no key;
    no key: every request is its own. The leases, invoices and the balance's charges are
    exactly those of the model."""
    with transaction.atomic():
        user = User.objects.create_user(f"prop{next(_users)}", password="x" * 20)
        balance_top_up(customer=user, amount_cents=10_000_000, now=timezone.now())
        start = account_for(user).balance_cents
        token = api_token_create(customer=user, name="p", scopes=("read", "order", "pay"))[1]
        done: dict[str, tuple[int, bytes]] = {}   # key → (body index, first answer)
        orders = 0
        for key, index in requests:
            response = post(client, token, "/api/v1/orders", BODIES[index], key=key)
            valid = BODIES[index]["site"] != "NOPE-1"
            if key in done:
                if done[key][0] == index:
                    assert response.status_code == 201 and response.content == done[key][1]
                else:
                    assert response.status_code == 422
                continue
            assert response.status_code == (201 if valid else 400)
            if valid:
                orders += 1
                if key is not None:
                    done[key] = (index, response.content)
        leases = Lease.objects.filter(customer=user)
        assert leases.count() == Invoice.objects.filter(customer=user).count() == orders
        charged = -sum(LedgerEntry.objects.filter(account__customer=user, kind=LedgerEntry.Kind.ORDER)
                       .values_list("amount_cents", flat=True))
        assert charged == start - account_for(user).balance_cents == sum(lease.price_cents for lease in leases)
        transaction.set_rollback(True)  # the next example starts from the same stock
