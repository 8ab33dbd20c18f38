"""One webhook POST, safely: the host is resolved once, every address it resolves to must
be public (no private, loopback, link-local, multicast or reserved address: server-side
request forgery), and the connection goes to that checked address (pinned, so a second DNS
answer cannot swap it) with the original host name for Host, SNI and the certificate. A
short timeout; redirects are not followed. Signed as Standard Webhooks do it: headers
`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body">` with the endpoint's secret."""
import base64
import hashlib
import hmac
import http.client
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.translation import gettext as _

from .models import SECRET_PREFIX

USER_AGENT = "gpu-rental-webhooks/1"
MAX_RESPONSE_BYTES = 4096


class Refused(Exception):
    """The URL or its address is not allowed; the message says why."""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None
    error: str


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


#: IPv6 prefixes whose addresses carry an IPv4 address that a relay or translator delivers to:
#: NAT64 (RFC 6052) and the deprecated IPv4-compatible form. 6to4 and Teredo are read by
#: ipaddress itself (sixtofour, teredo).
_EMBEDDING_96 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::/96"))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to through a relay (6to4, Teredo client, NAT64)."""
    found = [a for a in (ip.sixtofour, ip.teredo and ip.teredo[1]) if a is not None]
    if any(ip in network for network in _EMBEDDING_96) and int(ip) > 1:  # not :: or ::1
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def address_allowed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A webhook may connect to a global unicast address, and an IPv6 address only when every
    IPv4 address it embeds is one too: a 6to4 (2002:7f00:1::) or NAT64 address reaches
    127.0.0.1 through a relay."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped:
            return address_allowed(ip.ipv4_mapped)
        if not all(address_allowed(v4) for v4 in _embedded_ipv4(ip)):
            return False
    if settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES:  # tests' local receiver only (check --deploy refuses it)
        return not ip.is_unspecified and not ip.is_multicast
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified or ip.is_link_local)


def check_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an acceptable URL, else Refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(_("the URL must be http:// or https:// with a host name"))
    if parts.username or parts.password:
        raise Refused(_("the URL must not contain a user name or password"))
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise Refused(_("the URL's port is not valid")) from exc
    return parts.scheme, parts.hostname, port


def resolve(host: str, port: int) -> str:
    """The address to connect to: the first one the host resolves to, once every one of
    them is allowed (a host with any private address is refused outright)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused(_("%(host)s does not resolve") % {"host": host}) from exc
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        if not address_allowed(ipaddress.ip_address(address.split("%", 1)[0])):
            raise Refused(_("%(host)s resolves to %(address)s, a private, loopback or link-local address")
                          % {"host": host, "address": address})
    return addresses[0]


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host, port, address, timeout):
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self):
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host, port, address, timeout):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self):
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(*, url: str, secret: str, msg_id: str, event: str, timestamp: int, body: bytes) -> Outcome:
    try:
        scheme, host, port = check_url(url)
        address = resolve(host, port)
    except Refused as exc:
        return Outcome(False, None, f"refused: {exc}")
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    conn = cls(host, port, address, settings.WEBHOOK_TIMEOUT_SECONDS)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "webhook-id": msg_id,
               "webhook-timestamp": str(timestamp), "webhook-event": event,
               "webhook-signature": signature(secret, msg_id, timestamp, body)}
    try:
        conn.request("POST", target, body=body, headers=headers)
        response = conn.getresponse()
        response.read(MAX_RESPONSE_BYTES)
        status = response.status
    except (OSError, http.client.HTTPException) as exc:
        return Outcome(False, None, f"{exc.__class__.__name__}: {exc}"[:300])
    finally:
        conn.close()
    if 200 <= status < 300:
        return Outcome(True, status, "")
    return Outcome(False, status, f"HTTP {status}")
