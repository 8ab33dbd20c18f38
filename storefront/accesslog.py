"""The production access log (scripts/start.sh web serves `storefront.wsgi:served`; docs/adr/0019):
WSGI middleware around the Django application, so its rules hold under any WSGI server.

- the client's address, not the reverse proxy's: behind Caddy every connection comes from
  Caddy, which sets X-Forwarded-For to the address it saw (replacing whatever a client
  sent). The entry read is the one django-axes reads (PROXIES_AFTER_CLIENT entries from the
  end); the proxy's own address is logged after it as `via`.
- no line for a node agent's poll answered successfully. A fleet polls at every
  NODE_POLL_SECONDS (10,000 nodes at 15 s: 57 M lines a day); refusals (4xx) and failures
  (5xx) are logged like any request.
- no secret in a logged URL: the password-reset link carries its token in the path
  (/accounts/password/reset/<uid>/<token>/), so the token is replaced by `[redacted]` in
  the request line and the referrer.

One line per request, in the combined log format with the proxy added, on stdout (the web
container's log), written once the application has answered (status and headers):

    203.0.113.9 via 10.0.0.2 - - [04/Dec/2026:05:21:11 +0000] "GET /gpus/ HTTP/1.1" 200 5120 "-" "curl/8.1"

Plain Python, no Django imports."""
import os
import re
import sys
import threading
import time
from urllib.parse import quote

AGENT_POLLS = frozenset({"/agent/v1/report", "/agent/v1/desired"})
RESET_TOKEN = re.compile(r"(/password/reset/[^/\s?]+/)(?!set-password/)[^/\s?]+")


def redact(text: str) -> str:
    return RESET_TOKEN.sub(r"\1[redacted]", text or "")


def client_address(environ) -> str:
    peer = environ.get("REMOTE_ADDR", "-")
    forwarded = [part.strip() for part in environ.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    after_client = int(os.environ.get("PROXIES_AFTER_CLIENT", "0"))
    if len(forwarded) > after_client:
        return forwarded[-1 - after_client]
    return peer


def _target(environ) -> str:
    """The request target as the client sent it: the server's raw URI where it gives one,
    else the path (WSGI decodes it as latin-1) quoted again, with the query string."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return raw
    path = quote(environ.get("PATH_INFO", "").encode("latin-1"), safe="/:@!$&'()*+,;=-._~%")
    query = environ.get("QUERY_STRING", "")
    return f"{path}?{query}" if query else path


def access_line(environ, status: str, headers, now: float) -> str:
    length = next((v for k, v in headers if k.lower() == "content-length"), "-")
    request = f"{environ.get('REQUEST_METHOD', '-')} {_target(environ)} {environ.get('SERVER_PROTOCOL', '-')}"
    stamp = time.strftime("[%d/%b/%Y:%H:%M:%S +0000]", time.gmtime(now))
    return (f'{client_address(environ)} via {environ.get("REMOTE_ADDR", "-")} - - {stamp} "{redact(request)}" '
            f'{status.split(" ", 1)[0]} {length} "{redact(environ.get("HTTP_REFERER", "-"))}" '
            f'"{environ.get("HTTP_USER_AGENT", "-")}"')


class AccessLog:
    """Wraps a WSGI application; one access line per request on `stream` (stdout)."""

    def __init__(self, app, stream=None):
        self.app, self.stream, self._lock = app, stream, threading.Lock()

    def __call__(self, environ, start_response):
        def logged_start_response(status, headers, exc_info=None):
            if not (environ.get("PATH_INFO") in AGENT_POLLS and status[:1] in "123"):
                self._write(access_line(environ, status, headers, time.time()))
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        return self.app(environ, logged_start_response)

    def _write(self, line: str) -> None:
        stream = self.stream or sys.stdout
        with self._lock:                  # a whole line at a time from the worker's threads
            stream.write(line + "\n")
            stream.flush()
