"""gunicorn's access log for the production stack (scripts/start.sh web), issue 28:

- the client's address, not the reverse proxy's: behind Caddy every connection comes from
  Caddy, which sets X-Forwarded-For to the address it saw (replacing whatever a client
  sent). The entry read is the one django-axes reads (PROXIES_AFTER_CLIENT entries from the
  end); the proxy's own address is logged after it as `via`.
- issue 31: no line for a node agent's poll answered successfully. A fleet polls at every
  NODE_POLL_SECONDS (10,000 nodes at 15 s: 57 M lines a day, ~0.1 ms of a worker's CPU
  each); refusals (4xx) and failures (5xx) are logged like any request.
- no secret in a logged URL: the password-reset link carries its token in the path
  (/accounts/password/reset/<uid>/<token>/), so the token is replaced by `[redacted]` in
  the request line, the path and the referrer.

Loaded by gunicorn before the Django app: plain Python, no Django imports."""
import os
import re

from gunicorn.glogging import Logger

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


class AccessLogger(Logger):
    def access(self, resp, req, environ, request_time):
        if environ.get("PATH_INFO") in AGENT_POLLS and (resp.status_code or 500) < 400:
            return
        super().access(resp, req, environ, request_time)

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        atoms["{peer}e"] = environ.get("REMOTE_ADDR", "-")
        atoms["h"] = client_address(environ)
        for atom in ("r", "U", "f"):
            atoms[atom] = redact(atoms.get(atom))
        return atoms
