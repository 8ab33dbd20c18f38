"""The customers' API is rate limited per client address (an IPv6 client is its /64) and
per token: past a limit the answer is a JSON 429 with Retry-After, and other tokens and
other addresses go on being served."""
import pytest

from rental.accounts.services import api_token_create


def get(client, url, address, token=None):
    extra = {"REMOTE_ADDR": address}
    if token:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client.get(url, **extra)


def assert_limited(response, setting):
    assert response.status_code == 429
    assert response.json()["error"] == "rate_limited" and response.json()["limit"] == setting
    assert 0 < int(response["Retry-After"]) <= 60


def test_a_token_over_its_limit_gets_429_and_other_tokens_do_not(client, customer, other_customer, settings):
    settings.API_REQUESTS_PER_TOKEN_PER_MINUTE, settings.API_REQUESTS_PER_IP_PER_MINUTE = 3, 1000
    busy = api_token_create(customer=customer, name="busy")[1]
    second = api_token_create(customer=customer, name="second")[1]
    bob = api_token_create(customer=other_customer, name="bob")[1]
    for address in ("198.51.100.1", "198.51.100.2", "198.51.100.3"):  # a new address does not reset it
        assert get(client, "/api/v1/leases", address, busy).status_code == 200
    assert_limited(get(client, "/api/v1/leases", "198.51.100.4", busy), "API_REQUESTS_PER_TOKEN_PER_MINUTE")
    assert_limited(get(client, "/api/v1/account", "198.51.100.4", busy), "API_REQUESTS_PER_TOKEN_PER_MINUTE")
    assert get(client, "/api/v1/leases", "198.51.100.1", second).status_code == 200
    assert get(client, "/api/v1/leases", "198.51.100.1", bob).status_code == 200


@pytest.mark.parametrize("same_client, other_client", [
    ("198.51.100.7", "198.51.100.8"),
    ("2001:db8:1:2::1", "2001:db8:1:3::1"),     # an IPv6 client is its /64
])
def test_an_address_over_its_limit_gets_429_and_other_addresses_do_not(client, db, settings, same_client,
                                                                        other_client):
    settings.API_REQUESTS_PER_IP_PER_MINUTE = 4
    first = same_client
    for n in range(4):
        # In IPv6 every request comes from a fresh address of the same /64.
        address = first if ":" not in first else first.replace("::1", f"::{n + 10:x}")
        assert get(client, "/api/v1/offers", address).status_code == 200
    assert_limited(get(client, "/api/v1/offers", first), "API_REQUESTS_PER_IP_PER_MINUTE")
    # Guessing tokens counts too: the limit comes before the token is looked at.
    assert_limited(get(client, "/api/v1/leases", first, "gpr_guess"), "API_REQUESTS_PER_IP_PER_MINUTE")
    assert get(client, "/api/v1/offers", other_client).status_code == 200


def test_the_limits_are_named_settings_read_per_request(client, customer, settings):
    token = api_token_create(customer=customer, name="t")[1]
    settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 1
    assert get(client, "/api/v1/leases", "198.51.100.9", token).status_code == 200
    assert get(client, "/api/v1/leases", "198.51.100.9", token).status_code == 429
    settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 100
    assert get(client, "/api/v1/leases", "198.51.100.9", token).status_code == 200


@pytest.mark.redis
def test_a_high_limit_is_counted_in_reservations_on_redis(client, db, settings):
    """On Redis a limit of more than API_RATE_RESERVATIONS_PER_WINDOW uses is counted in
    reservations (rental.accounts.throttle_reservations): one process allows exactly the
    limit and then refuses, and the shared counter moved a reservation at a time."""
    from django.core.cache import cache

    settings.API_REQUESTS_PER_IP_PER_MINUTE, settings.API_RATE_RESERVATIONS_PER_WINDOW = 40, 8  # 5 a time
    assert hasattr(cache, "reserve")
    for _ in range(40):
        assert get(client, "/api/v1/offers", "198.51.100.20").status_code == 200
    assert cache.get("throttle:api-address:198.51.100.20") == 40  # 8 round trips, not 40
    assert_limited(get(client, "/api/v1/offers", "198.51.100.20"), "API_REQUESTS_PER_IP_PER_MINUTE")
    assert cache.get("throttle:api-address:198.51.100.20") == 45  # the refused reservation counted too
    redis, key = cache.redis_client(), cache.make_and_validate_key("throttle:api-address:198.51.100.20")
    assert 0 < redis.ttl(key) <= 60  # the window's expiry, set once
    assert get(client, "/api/v1/offers", "198.51.100.21").status_code == 200
