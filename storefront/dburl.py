"""DATABASE_URL, with libpq's multi-host form: a standby that takes over is only useful if
the storefront finds it by itself.

    postgres://user@db1:5432,db2:5432/store?target_session_attrs=read-write

libpq tries the hosts in order and, with target_session_attrs=read-write, keeps the one that
accepts writes: after a failover (docs/operations/high-availability.md) new connections go to
the new primary without a restart or a DNS change. dj-database-url reads only one host from
the URL's authority, so the host list is moved into the query (host=db1,db2&port=5432,5432),
which it hands to the driver as OPTIONS; a one-host URL is passed through unchanged."""
from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import dj_database_url

DEFAULT_PORT = "5432"


def multi_host_to_query(url: str) -> str:
    """The same URL with a comma-separated host list moved from the authority into the
    `host` and `port` query parameters (one port per host, 5432 where none is given)."""
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist:
        return url
    hosts, ports = [], []
    for item in hostlist.split(","):
        if item.startswith("["):  # [::1]:5432
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host:
            raise ValueError(f"DATABASE_URL: an empty host in the host list {hostlist!r}")
        if port and not port.isdigit():
            raise ValueError(f"DATABASE_URL: port {port!r} of host {host!r} is not a number")
        hosts.append(host)
        ports.append(port or DEFAULT_PORT)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in {"host", "port"}]
    query = [("host", ",".join(hosts)), ("port", ",".join(ports)), *query]
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}", query=urlencode(query, safe=",")))


def parse(url: str, **kwargs) -> dict:
    """dj_database_url.parse, after `multi_host_to_query`."""
    return dj_database_url.parse(multi_host_to_query(url), **kwargs)
