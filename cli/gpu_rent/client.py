"""The HTTP client: bearer token, JSON in and out, every failure a CliError with its exit code."""
import requests

from . import __version__
from .errors import BY_STATUS, FAILED, NOT_LOGGED_IN, UNREACHABLE, CliError

TIMEOUT_SECONDS = 30


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
                auth: bool = True) -> dict:
        headers = {}
        if auth:
            if not self.token:
                raise CliError(NOT_LOGGED_IN, "Not logged in: run `gpu-rent login` (or set GPU_RENT_TOKEN).")
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = self.session.request(method, f"{self.base}/api/v1/{path.lstrip('/')}", json=body,
                                            params=params, headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise CliError(UNREACHABLE, f"Cannot reach {self.base}: {exc.__class__.__name__}: {exc}") from exc
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

    def get(self, path: str, **kw) -> dict:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: dict | None = None, **kw) -> dict:
        return self.request("POST", path, body=body or {}, **kw)

    def delete(self, path: str, **kw) -> dict:
        return self.request("DELETE", path, **kw)
