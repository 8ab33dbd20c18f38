"""One webhook POST, safely: the host is resolved once, every address it resolves to must
be public (no private, loopback, link-local, multicast or reserved address: server-side
request forgery), and the connection goes to that checked address (pinned, so a second DNS
answer cannot swap it) with the original host name for Host, SNI and the certificate. A
short timeout per connect and read, and a hard deadline on the whole attempt (name resolution,
TLS handshake, request and the whole response); redirects are not followed. Signed as
Standard Webhooks do it: headers
`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body">` with the endpoint's secret."""
import base64
import hashlib
import hmac
import http.client
import ipaddress
import socket
import ssl
import threading
import time
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


class Deadline:
    """An attempt's wall clock. A socket timeout bounds one read, and a receiver that sends a
    byte every few seconds never lets one expire; so when the deadline passes, a timer shuts
    down every socket the attempt opened, whatever it is blocked in (TLS handshake, a header
    line trickling in, the body), and the attempt fails at once. `close` stops the timer before
    the attempt closes its sockets, so a cut never reaches a socket that is no longer its."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.ends = time.monotonic() + seconds
        self.expired = False  # the timer cut the attempt
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    @property
    def message(self) -> str:
        return f"deadline: no complete answer within {self.seconds:g} s"

    def passed(self) -> bool:
        """Cut by the timer, or over by the clock (a step whose own timeout was what was left,
        such as a TLS handshake, may end a moment before the timer fires)."""
        return self.expired or time.monotonic() >= self.ends

    def timeout(self) -> float:
        """The timeout of one blocking step: WEBHOOK_TIMEOUT_SECONDS, or what is left if less."""
        left = self.ends - time.monotonic()
        if left <= 0 or self.expired:
            raise TimeoutError(self.message)
        return min(settings.WEBHOOK_TIMEOUT_SECONDS, left)

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            if self.expired:
                sock.close()
                raise TimeoutError(self.message)
            self._sockets.append(sock)

    def _cut(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.expired = True
            for sock in self._sockets:
                try:  # the plain socket's shutdown: an SSLSocket's would also drop its TLS state under the reader
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:  # already closed, or a raw socket that TLS took over
                    pass

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True


def _getaddrinfo(host: str, port: int, timeout: float | None) -> list:
    """socket.getaddrinfo, given up after `timeout` seconds: a resolver asking a customer's
    slow name server blocks for its own timeouts and retries, which no socket timeout bounds.
    The lookup's thread is left to finish on its own."""
    if timeout is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    outcome: dict = {}
    done = threading.Event()

    def lookup():
        try:
            outcome["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=lookup, name="webhook-resolve", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"{host} did not resolve within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["infos"]


def resolve(host: str, port: int, timeout: float | None = None) -> str:
    """The address to connect to: the first one the host resolves to, once every one of
    them is allowed (a host with any private address is refused outright)."""
    try:
        infos = _getaddrinfo(host, port, timeout)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused(_("%(host)s does not resolve") % {"host": host}) from exc
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        if not address_allowed(ipaddress.ip_address(address.split("%", 1)[0])):
            raise Refused(_("%(host)s resolves to %(address)s, a private, loopback or link-local address")
                          % {"host": host, "address": address})
    return addresses[0]


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host, port, address, deadline: Deadline):
        super().__init__(host, port, timeout=deadline.timeout())
        self._address, self._deadline = address, deadline

    def _socket(self) -> socket.socket:
        sock = socket.create_connection((self._address, self.port), self._deadline.timeout())
        self._deadline.watch(sock)
        return sock

    def connect(self):
        self.sock = self._socket()


class _PinnedHTTPS(_PinnedHTTP):
    def connect(self):
        context = ssl.create_default_context()
        sock = context.wrap_socket(self._socket(), server_hostname=self.host, do_handshake_on_connect=False)
        self._deadline.watch(sock)  # wrapping took the file descriptor over: watch the TLS socket
        try:
            sock.do_handshake()
        except BaseException:
            sock.close()  # not the connection's yet: its close() would not reach it
            raise
        self.sock = sock


def post(*, url: str, secret: str, msg_id: str, event: str, timestamp: int, body: bytes) -> Outcome:
    """One attempt, over in at most WEBHOOK_ATTEMPT_DEADLINE_SECONDS whatever the receiver does."""
    deadline = Deadline(settings.WEBHOOK_ATTEMPT_DEADLINE_SECONDS)
    conn = None
    try:
        scheme, host, port = check_url(url)
        address = resolve(host, port, timeout=deadline.timeout())
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
        conn = cls(host, port, address, deadline)
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "webhook-id": msg_id,
                   "webhook-timestamp": str(timestamp), "webhook-event": event,
                   "webhook-signature": signature(secret, msg_id, timestamp, body)}
        conn.request("POST", target, body=body, headers=headers)
        response = conn.getresponse()
        response.read(MAX_RESPONSE_BYTES)
        status = response.status
    except Refused as exc:
        return Outcome(False, None, f"refused: {exc}")
    except (OSError, http.client.HTTPException) as exc:
        if deadline.passed():  # the cut surfaces as whatever the blocked call saw: EOF, reset, SSL error
            return Outcome(False, None, deadline.message)
        return Outcome(False, None, f"{exc.__class__.__name__}: {exc}"[:300])
    finally:
        deadline.close()
        if conn is not None:
            conn.close()
    if deadline.expired:  # a body read until the connection closes ends quietly when it is cut
        return Outcome(False, None, deadline.message)
    if 200 <= status < 300:
        return Outcome(True, status, "")
    return Outcome(False, status, f"HTTP {status}")
