"""The client's address that throttles, rate limits and orders count on is the one
django-axes resolves: rental.accounts.throttle reads the plain cases itself (one global IPv4
X-Forwarded-For entry, or no such header and an IPv4 REMOTE_ADDR) and must agree with axes
on every request, plain or not, and under other proxy settings."""

import ipaddress

from axes.helpers import get_client_ip_address
from django.test import RequestFactory, override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from rental.accounts.throttle import _plain_ipv4, client_address, order_address, throttle_address

_ipv4 = st.ip_addresses(v=4).map(str)
_ipv6 = st.ip_addresses(v=6).map(str)
# what reaches a header: addresses (global, private, loopback, reserved), ports, chains, junk
_entry = st.one_of(
    _ipv4, _ipv6,
    st.sampled_from(["203.0.113.9", "8.8.8.8", "10.0.0.2", "127.0.0.1", "0.0.0.0", "255.255.255.255",
                     "224.0.0.1", "100.64.0.1", "192.0.2.1", "::1", "::ffff:8.8.8.8", "64:ff9b::808:808",
                     "unknown", "", " ", "1.2.3.04", "01.2.3.4", "1.2.3", "١.٢.٣.٤"]),
    _ipv4.map(lambda a: f"{a}:8080"), _ipv4.map(lambda a: f" {a} "), _ipv4.map(lambda a: f'"{a}"'),
    _ipv6.map(lambda a: f"[{a}]:443"), st.text(max_size=12))
_header = st.one_of(_entry, st.lists(_entry, min_size=2, max_size=3).map(", ".join))


def _request(forwarded, remote):
    meta = {}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    request = RequestFactory().get("/api/v1/estimate", **meta)
    if remote is None:
        del request.META["REMOTE_ADDR"]
    else:
        request.META["REMOTE_ADDR"] = remote
    return request


def _axes_throttle_address(request) -> str:
    """throttle_address as it was written over axes' answer alone."""
    address = get_client_ip_address(request) or "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _agree(request) -> None:
    assert client_address(request) == (get_client_ip_address(request) or "unknown")
    assert throttle_address(request) == _axes_throttle_address(request)
    try:
        ordered = str(ipaddress.ip_address(get_client_ip_address(request) or ""))
    except ValueError:
        ordered = None
    assert order_address(request) == ordered


@settings(max_examples=600, deadline=None)
@given(st.none() | _header, st.none() | _entry)
def test_the_client_address_is_the_one_axes_resolves(forwarded, remote):
    _agree(_request(forwarded, remote))


@settings(max_examples=150, deadline=None)
@given(st.none() | _header, st.none() | _entry, st.sampled_from([
    {"AXES_IPWARE_PROXY_COUNT": 1}, {"AXES_IPWARE_META_PRECEDENCE_ORDER": ("REMOTE_ADDR",)},
    {"AXES_IPWARE_PROXY_TRUSTED_IPS": ["10.0.0.0/8"]}, {"IPWARE_ALGORITHM": "legacy"},
    {"AXES_CLIENT_IP_CALLABLE": lambda request: "198.51.100.7"}]))
def test_other_proxy_settings_take_axes_way(forwarded, remote, changed):
    with override_settings(**changed):
        request = _request(forwarded, remote)
        assert _plain_ipv4(request.META) is None
        _agree(request)


def test_the_plain_cases_are_read_without_axes():
    # Caddy's one entry, and a direct connection (no proxy: development, the test client)
    assert _plain_ipv4(_request("93.184.216.34", "10.0.0.2").META) == "93.184.216.34"
    assert _plain_ipv4(_request(None, "127.0.0.1").META) == "127.0.0.1"
    # a private forwarded entry is weighed against REMOTE_ADDR by python-ipware: axes decides
    assert _plain_ipv4(_request("10.0.0.5", "127.0.0.1").META) is None
