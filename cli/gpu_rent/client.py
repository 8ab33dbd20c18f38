"""The HTTP client: bearer token, JSON in and out, every failure a CliError with its exit code.

Every write carries an Idempotency-Key (a fresh UUID per command's write); when the answer
does not come (a timeout, a dropped connection, a 502/503/504) the same request is sent
again with the same key, up to RETRIES more times, so the server does it at most once."""
import time
import uuid

import requests

from . import __version__
from .errors import BY_STATUS, FAILED, NOT_LOGGED_IN, UNREACHABLE, CliError

TIMEOUT_SECONDS = 30
RETRIES = 2                   #: more tries of a request whose answer did not come
RETRY_PAUSE_SECONDS = 1.0     #: before the first retry; doubles after each
RETRY_STATUSES = frozenset({502, 503, 504})  #: a proxy's "no answer": retried with the same key
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Api:
    def __init__(self, url: str, token: str = "", timeout: float = TIMEOUT_SECONDS):
        if not url:
            raise CliError(NOT_LOGGED_IN, "No server: run `gpu-rent login --url https://…` (or set GPU_RENT_URL).")
        self.base = url.rstrip("/")
        self.token, self.timeout = token, timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"gpu-rent/{__version__}"
        self.session.headers["Accept"] = "application/json"

    def request(self, method: str, path: str, *, body: dict | None = None, params: dict | None = None,
                auth: bool = True, idempotency_key: str | None = None) -> dict:
        headers = {}
        if auth:
            if not self.token:
                raise CliError(NOT_LOGGED_IN, "Not logged in: run `gpu-rent login` (or set GPU_RENT_TOKEN).")
            headers["Authorization"] = f"Bearer {self.token}"
        if method in WRITE_METHODS:
            headers["Idempotency-Key"] = idempotency_key or str(uuid.uuid4())
        response = self._send(method, path, body=body, params=params, headers=headers)
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 500 or not isinstance(data, dict):
            raise CliError(UNREACHABLE, f"{self.base} answered {response.status_code} without the API's JSON.")
        if response.status_code >= 400:
            message = str(data.get("message") or data.get("error") or response.reason)
            fields = data.get("fields")
            if isinstance(fields, dict):
                message += "".join(f"\n  {name}: {' '.join(map(str, errs))}" for name, errs in fields.items())
            raise CliError(BY_STATUS.get(response.status_code, FAILED), message, error=str(data.get("error", "")),
                           detail={k: v for k, v in data.items() if k not in ("error", "message")})
        return data

    def _send(self, method: str, path: str, *, body, params, headers) -> requests.Response:
        """The request, tried again (same headers, so the same Idempotency-Key) while no answer
        comes; a GET is always safe to repeat, a write is made safe by its key."""
        pause = RETRY_PAUSE_SECONDS
        for attempt in range(RETRIES + 1):
            last = attempt == RETRIES
            try:
                response = self.session.request(method, f"{self.base}/api/v1/{path.lstrip('/')}", json=body,
                                                params=params, headers=headers, timeout=self.timeout)
            except requests.RequestException as exc:
                if last or not isinstance(exc, (requests.Timeout, requests.ConnectionError)):
                    raise CliError(UNREACHABLE, f"Cannot reach {self.base}: {exc.__class__.__name__}: {exc}"
                                   + (" (nothing was done twice: each try sent the same Idempotency-Key)"
                                      if method in WRITE_METHODS and attempt else "")) from exc
            else:
                if last or response.status_code not in RETRY_STATUSES:
                    return response
            time.sleep(pause)
            pause *= 2
        raise AssertionError("not reached")

    def get(self, path: str, **kw) -> dict:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: dict | None = None, **kw) -> dict:
        return self.request("POST", path, body=body or {}, **kw)

    def delete(self, path: str, **kw) -> dict:
        return self.request("DELETE", path, **kw)

    def patch(self, path: str, body: dict | None = None, **kw) -> dict:
        return self.request("PATCH", path, body=body or {}, **kw)
