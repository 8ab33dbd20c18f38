"""A small server speaking the storefront's side of nodeagent/PROTOCOL.md, for the
agent's own tests (the real storefront is the fleet app, used by test_end_to_end.py). It
checks what the real one checks: credential, report signature over the raw body, seq
replay, and each evidence record's signature over its canonical JSON."""
import base64
import json
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from nodeagent.signing import canonical_json


def verify(public_key_b64: str, signature_b64: str, data: bytes) -> bool:
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64))
    try:
        key.verify(base64.b64decode(signature_b64), data)
        return True
    except (InvalidSignature, ValueError):
        return False


@dataclass
class Node:
    name: str
    credential: str = ""
    public_key: str = ""
    last_seq: int = 0
    instances: list = field(default_factory=list)
    reports: list = field(default_factory=list)
    evidence: list = field(default_factory=list)
    poll_seconds: float = 1          # what enrolment and the desired state tell the agent


class StorefrontDouble:
    def __init__(self):
        self.codes: dict[str, Node] = {}
        self.nodes: dict[str, Node] = {}
        self.lock = threading.Lock()
        self.server = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def enrolment_code(self, node_name: str) -> str:
        code = secrets.token_hex(12)  # as the storefront's: never a leading '-'
        self.codes[code] = self.nodes.setdefault(node_name, Node(node_name))
        return code

    def start(self) -> None:
        """Listen (again, on the same port after `stop`: a storefront outage)."""
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- protocol ------------------------------------------------------------------------
    def enrol(self, body: dict):
        node = self.codes.pop(body.get("code"), None)
        if node is None:
            return 403, {"error": "enrolment_refused"}
        node.credential, node.public_key = secrets.token_urlsafe(24), body["public_key"]
        return 200, {"node": node.name, "credential": node.credential,
                     "poll_seconds": node.poll_seconds}

    def node_for(self, authorization: str | None) -> Node | None:
        scheme, _, credential = (authorization or "").partition(" ")
        return next((n for n in self.nodes.values()
                     if scheme == "Node" and credential and n.credential == credential), None)

    def desired(self, node: Node):
        return 200, {"node": node.name, "generated_at": "2026-12-01T00:00:00Z",
                     "poll_seconds": node.poll_seconds, "instances": node.instances}

    def report(self, node: Node, raw: bytes, signature: str | None):
        if not signature or not verify(node.public_key, signature, raw):
            return 401, {"error": "bad_signature"}
        body = json.loads(raw)
        if body["seq"] <= node.last_seq:
            return 409, {"error": "replayed"}
        node.last_seq = body["seq"]
        node.reports.append(body)
        accepted, refused = [], []
        for i, record in enumerate(body.get("evidence", [])):
            unsigned = {k: v for k, v in record.items() if k != "signature"}
            if verify(node.public_key, record.get("signature", ""), canonical_json(unsigned)):
                node.evidence.append(record)
                accepted.append(f"evidence[{i}]")
            else:
                refused.append({"item": f"evidence[{i}]", "error": "bad_signature"})
        return 200, {"accepted": accepted, "refused": refused}


def _handler(double: StorefrontDouble):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            with double.lock:
                node = double.node_for(self.headers.get("Authorization"))
                if self.path != "/agent/v1/desired":
                    return self._send(404, {"error": "not_found"})
                self._send(*(double.desired(node) if node else (401, {"error": "unknown"})))

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with double.lock:
                if self.path == "/agent/v1/enrol":
                    return self._send(*double.enrol(json.loads(raw)))
                node = double.node_for(self.headers.get("Authorization"))
                if node is None:
                    return self._send(401, {"error": "unknown"})
                self._send(*double.report(node, raw, self.headers.get("X-Node-Signature")))

        def _send(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
