"""HTTPS client for the storefront's /agent/v1 API (PROTOCOL.md). The agent always
connects out (nodes behind NAT work); network trouble is `StorefrontUnreachable`, which the
loop answers by backing off and leaving every instance as it is."""
import json
from urllib.parse import urlencode

import requests

from . import __version__
from .signing import NodeKey

NOT_MODIFIED = object()     # a 304 answer: the copy the client holds is current


class StorefrontUnreachable(Exception):
    """No usable answer (network error, timeout, 5xx): retry later, change nothing."""


class StorefrontRefused(Exception):
    """A definite 4xx answer, e.g. `enrolment_refused`, `replayed`, `bad_signature`."""

    def __init__(self, status: int, error: str):
        super().__init__(f"HTTP {status}: {error}")
        self.status, self.error = status, error


class StorefrontClient:
    def __init__(self, url: str, *, credential: str = "", verify: bool | str = True,
                 timeout: float = 20.0):
        self.url = url.rstrip("/")
        self.credential = credential
        self.session = requests.Session()
        self.session.verify = verify
        self.session.headers["User-Agent"] = f"gpu-node-agent/{__version__}"
        self.timeout = timeout
        self._desired: dict | None = None
        self._desired_etag = ""
        self._last_etag = ""
        self._last_version = ""
        #: The desired-state version the held document is at least as new as (the header
        #: X-Desired-Version of the answer it came with; "" from a storefront without it).
        self.desired_version = ""

    def enrol(self, *, code: str, public_key: str, hostname: str) -> dict:
        body = {"code": code, "public_key": public_key, "agent_version": __version__,
                "hostname": hostname}
        return self._call("POST", "/agent/v1/enrol", data=json.dumps(body).encode())

    def desired(self) -> dict:
        """The desired state; sent with the ETag of the last one, so an unchanged state is
        a bodiless `304` (PROTOCOL.md) and the copy kept here is returned."""
        headers = self._auth()
        if self._desired is not None:
            headers["If-None-Match"] = self._desired_etag
        document = self._call("GET", "/agent/v1/desired", headers=headers)
        self.desired_version = self._last_version
        if document is NOT_MODIFIED:
            return self._desired
        self._desired, self._desired_etag = document, self._last_etag
        return document

    def watch(self, version: str, wait: float) -> bool:
        """Whether the desired state moved past `version`: answered as soon as it does, or
        after `wait` seconds with False (PROTOCOL.md, GET /agent/v1/desired/watch).
        StorefrontRefused with status 404 from a storefront that predates it."""
        query = urlencode({"version": version, "wait": f"{max(wait, 0):.1f}"})
        answer = self._call("GET", f"/agent/v1/desired/watch?{query}", headers=self._auth(),
                            timeout=wait + self.timeout)
        return isinstance(answer, dict) and answer.get("changed") is True

    def report(self, report: dict, key: NodeKey, *, wait_from: tuple[str, float] | None = None) -> dict:
        """Signed; says which desired state this client holds (`desired_etag`, "" for none),
        so a storefront that knows it answers with the current one (PROTOCOL.md:
        one request per steady poll) — read it with `desired_from`. `wait_from` (the version
        held, seconds): sent as POST /agent/v1/report/watch, whose answer the storefront holds
        while that one is current, up to those seconds (StorefrontRefused with status 404 from
        a storefront that predates it; the report was then not taken)."""
        report = {**report, "desired_etag": self._desired_etag if self._desired is not None else ""}
        body = json.dumps(report, separators=(",", ":")).encode()
        headers = {**self._auth(), "X-Node-Signature": key.sign(body)}
        if wait_from is None:
            answer = self._call("POST", "/agent/v1/report", data=body, headers=headers)
        else:
            version, wait = wait_from
            query = urlencode({"version": version, "wait": f"{max(wait, 0):.1f}"})
            answer = self._call("POST", f"/agent/v1/report/watch?{query}", data=body, headers=headers,
                                timeout=wait + self.timeout)
        self.desired_version = self._last_version
        return answer

    def desired_from(self, answer: dict) -> dict | None:
        """The desired state a report's answer carries: the new document, or the copy held
        here when the answer says it is current (`"desired": null`); None when the storefront
        predates it (the caller GETs /agent/v1/desired)."""
        etag = answer.get("desired_etag") if isinstance(answer, dict) else None
        if not isinstance(etag, str):
            return None
        document = answer.get("desired")
        if isinstance(document, dict):
            self._desired, self._desired_etag = document, etag
            return document
        if document is None and self._desired is not None and etag == self._desired_etag:
            return self._desired
        return None

    def _auth(self) -> dict:
        return {"Authorization": f"Node {self.credential}"}

    def _call(self, method: str, path: str, *, data: bytes | None = None,
              headers: dict | None = None, timeout: float | None = None) -> dict:
        headers = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            # verify= on each call: requests prefers REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from
            # the environment over the session's own setting (the configured ca_bundle)
            response = self.session.request(method, self.url + path, data=data, headers=headers,
                                            timeout=timeout or self.timeout, verify=self.session.verify)
        except requests.RequestException as exc:
            raise StorefrontUnreachable(f"{method} {path}: {exc}") from exc
        self._last_etag = response.headers.get("ETag", "")
        self._last_version = response.headers.get("X-Desired-Version", "")
        if response.status_code == 304:
            return NOT_MODIFIED
        if response.status_code >= 500:
            raise StorefrontUnreachable(f"{method} {path}: HTTP {response.status_code}")
        try:
            payload = response.json()
        except ValueError:
            payload = {}
        if response.status_code >= 400:
            error = payload.get("error") if isinstance(payload, dict) else None
            raise StorefrontRefused(response.status_code, error or response.reason)
        return payload
