"""A read-only Docker registry (HTTP API v2, OCI manifests) for the image-pull tests: one
repository, one layer (an uncompressed rootfs tar), one image per tag. The private
dockerd pulls from it on 127.0.0.1 of its own network namespace (loopback registries
need no TLS), so this runs as `ip netns exec <node> python registry.py …`.

While the `--gate` file exists, layer downloads wait (after `--hold-after` bytes of the
layer were sent, 0 by default): a test holds a pull open for as long as it wants to show
that the agent's loop goes on meanwhile, or what progress it reports.

`--auth user:password` makes it a private registry: every request without those Basic
credentials gets 401 and a `WWW-Authenticate: Basic` challenge, as a registry with
htpasswd authentication answers."""
import argparse
import base64
import hashlib
import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def build(layer: str, tags: list[str]):
    layer_digest, layer_size = _file_digest(layer), os.path.getsize(layer)
    blobs, manifests = {}, {}
    for tag in tags:
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "config": {"Labels": {"test-tag": tag}},
                             "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode()
        blobs[_digest(config)] = config
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": LAYER, "digest": layer_digest, "size": layer_size}]}).encode()
        manifests[tag] = manifests[_digest(manifest)] = manifest
    return layer_digest, blobs, manifests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layer", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--tags", required=True)
    parser.add_argument("--gate", required=True)
    parser.add_argument("--hold-after", type=int, default=0)
    parser.add_argument("--auth", default="")
    args = parser.parse_args()
    expected = "Basic " + base64.b64encode(args.auth.encode()).decode() if args.auth else None
    layer_digest, blobs, manifests = build(args.layer, args.tags.split(","))
    prefix = f"/v2/{args.repo}/"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_HEAD(self):
            self.do_GET(body=False)

        def do_GET(self, body=True):
            if expected and self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("WWW-Authenticate", 'Basic realm="test-registry"')
                data = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)
                return
            if self.path in ("/v2/", "/v2"):
                return self._send(200, b"{}", "application/json", body)
            if not self.path.startswith(prefix):
                return self._send(404, b"{}", "application/json", body)
            kind, _, ref = self.path[len(prefix):].partition("/")
            if kind == "manifests" and ref in manifests:
                return self._send(200, manifests[ref], MANIFEST, body,
                                  digest=_digest(manifests[ref]))
            if kind == "blobs" and ref in blobs:
                return self._send(200, blobs[ref], "application/octet-stream", body, digest=ref)
            if kind == "blobs" and ref == layer_digest:
                return self._send_file(args.layer, body, ref)
            return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}',
                              "application/json", body)

        def _headers(self, status, length, ctype, digest=None):
            self.send_response(status)
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(length))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()

        def _send(self, status, data, ctype, body, digest=None):
            self._headers(status, len(data), ctype, digest)
            if body:
                self.wfile.write(data)

        def _send_file(self, path, body, digest):
            self._headers(200, os.path.getsize(path), "application/octet-stream", digest)
            if not body:
                return
            sent, held = 0, False
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    if not held and sent >= args.hold_after:
                        held = True
                        self.wfile.flush()
                        while os.path.exists(args.gate):
                            time.sleep(0.1)
                    self.wfile.write(chunk)
                    sent += len(chunk)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    assert re.fullmatch(r"[a-z0-9/._-]+", sys.argv[sys.argv.index("--repo") + 1])
    main()
