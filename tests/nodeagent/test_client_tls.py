"""The agent trusts the storefront's CA it is configured with (`ca_bundle`), also when the
node's environment names another bundle (REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE, which requests
would otherwise prefer over a session's own setting)."""
import datetime
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nodeagent.client import StorefrontClient, StorefrontUnreachable


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "storefront.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "ca.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Desired(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"node": "n", "instances": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_storefront(tmp_path):
    cert, key = self_signed(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Desired)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://localhost:{server.server_address[1]}", cert
    server.shutdown()


def test_the_configured_ca_is_used_whatever_bundle_the_environment_names(tls_storefront, monkeypatch, tmp_path):
    url, ca = tls_storefront
    other = tmp_path / "system-bundle.pem"
    other.write_text("")                       # trusts nothing, as far as this server goes
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))
    monkeypatch.setenv("CURL_CA_BUNDLE", str(other))
    assert StorefrontClient(url, credential="c", verify=str(ca)).desired()["node"] == "n"
    with pytest.raises(StorefrontUnreachable):          # and an unknown CA is still refused
        StorefrontClient(url, credential="c").desired()
