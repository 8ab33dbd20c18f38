"""DATABASE_URL's multi-host form (libpq: the first host that accepts writes) reaches the
driver as one host list and one port list, whatever the hosts; a one-host URL is parsed as
dj-database-url always did."""
import dj_database_url
import pytest
from hypothesis import given
from hypothesis import strategies as st

from storefront.dburl import multi_host_to_query, parse

hostnames = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)
ipv6 = st.ip_addresses(v=6).map(lambda a: f"[{a}]")
ports = st.none() | st.integers(1, 65535)


@given(st.lists(st.tuples(hostnames | ipv6, ports), min_size=2, max_size=5),
       st.sampled_from(["", "?target_session_attrs=read-write", "?sslmode=require&target_session_attrs=primary"]))
def test_every_host_and_its_port_reach_the_driver_in_order(hosts, query):
    netloc = ",".join(f"{h}:{p}" if p else h for h, p in hosts)
    db = parse(f"postgres://store:s3cret@{netloc}/shop{query}")
    assert db["OPTIONS"]["host"].split(",") == [h.strip("[]") for h, _ in hosts]
    assert db["OPTIONS"]["port"].split(",") == [str(p or 5432) for _, p in hosts]
    assert (db["ENGINE"], db["NAME"], db["USER"], db["PASSWORD"], db["HOST"]) == (
        "django.db.backends.postgresql", "shop", "store", "s3cret", "")
    for key, value in (pair.split("=") for pair in query.lstrip("?").split("&") if pair):
        assert db["OPTIONS"][key] == value


@pytest.mark.parametrize("url", ["postgres://store:pw@db1:5433/shop", "postgres://store@db1/shop?sslmode=require",
                                 "sqlite:////tmp/x.sqlite3"])
def test_a_one_host_url_is_left_alone(url):
    assert multi_host_to_query(url) == url
    assert parse(url) == dj_database_url.parse(url)


@pytest.mark.parametrize("url", ["postgres://u@db1,,db2/shop", "postgres://u@db1:5432,db2:x/shop"])
def test_a_broken_host_list_is_refused_with_what_is_wrong(url):
    with pytest.raises(ValueError, match="DATABASE_URL"):
        parse(url)
