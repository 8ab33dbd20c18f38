"""No spending key or secret in the repository or the logs.

The repository: every tracked file (`git ls-files`) is searched for serialised extended
private keys (xprv/tprv/zprv/...), PEM private keys, 64-hex values assigned to something
called a private key or secret, and a hard-coded SECRET_KEY. The only private keys allowed
are the published test vectors the tests use on purpose, and the test *derives* them to
prove that is what they are (BIP32 test vector 1; the BIP39 "abandon ... about" mnemonic).

The logs: settings.LOGGING never logs request bodies or SQL parameters, and a whole flow —
signup with a password, an API token created and used, a failed login — leaves neither
the password nor the raw token in any log record."""
import logging
import re
import subprocess
from pathlib import Path

import pytest
from bip_utils import Bip32Slip10Secp256k1, Bip39SeedGenerator
from django.conf import settings
from django.urls import reverse

ROOT = Path(__file__).resolve().parents[2]
EXT_PRIV = re.compile(r"\b(?:[xyzuvtYZ]prv|[LM]tpv|ttpv)[1-9A-HJ-NP-Za-km-z]{100,112}\b")
PEM = re.compile(r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----")
HEX_ASSIGN = re.compile(r"""(?i)(private_?key|priv_?key|secret(?:_key)?|spend_?key)["']?\s*[:=]\s*["']?(?:0x)?[0-9a-f]{64}\b""")
SECRET_KEY_ASSIGN = re.compile(r"""SECRET_KEY\s*=\s*["'][^"']{20,}["']""")
THIS_FILE = Path(__file__).relative_to(ROOT).as_posix()


def published_test_keys() -> set[str]:
    vector_1 = Bip32Slip10Secp256k1.FromSeed(bytes.fromhex("000102030405060708090a0b0c0d0e0f"))
    abandon = Bip32Slip10Secp256k1.FromSeed(Bip39SeedGenerator("abandon " * 11 + "about").Generate())
    return {vector_1.PrivateKey().ToExtended(), abandon.PrivateKey().ToExtended()}


def tracked_text_files():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, names):
        path = ROOT / name.decode()
        if path.is_file() and path.stat().st_size < 2_000_000 and path.as_posix().split("/")[-1] != THIS_FILE:
            data = path.read_bytes()
            if b"\0" not in data[:4096]:
                yield path.relative_to(ROOT).as_posix(), data.decode("utf-8", errors="replace")


def test_the_repository_holds_no_private_keys_or_secrets():
    allowed, found = published_test_keys(), []
    files = 0
    for name, text in tracked_text_files():
        if name == THIS_FILE:
            continue
        files += 1
        for key in EXT_PRIV.findall(text):
            if key not in allowed:
                found.append((name, "extended private key", key[:12] + "…"))
            elif not name.startswith("tests/"):
                found.append((name, "test vector outside tests/", key[:12] + "…"))
        for pattern, what in ((PEM, "PEM private key"), (HEX_ASSIGN, "64-hex private key/secret"),
                              (SECRET_KEY_ASSIGN, "hard-coded SECRET_KEY")):
            for match in pattern.finditer(text):
                found.append((name, what, match.group(0)[:40]))
    assert files > 100  # really looked
    assert not found, found


def test_the_patterns_catch_what_they_should():
    assert EXT_PRIV.search("k = 'tprv8ZgxMBicQKsPd7Uf69XL1XwhmjHopUGep8GuEiJDZmbQz6o58LninorQAfcKZWARbtRtfnLcJ5MQ2AtHcQJCCRUcMRvmDUjyEmNUWwx8UbK'")
    assert PEM.search("-----BEGIN PRIVATE KEY-----") and PEM.search("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert HEX_ASSIGN.search('private_key = "' + "ab" * 32 + '"') and HEX_ASSIGN.search('"secret": "' + "0f" * 32)
    assert SECRET_KEY_ASSIGN.search('SECRET_KEY = "django-insecure-abcdefghijklmnopqrstuvwxyz"')


def test_logging_config_logs_no_bodies_or_sql():
    config = settings.LOGGING
    text = repr(config)
    assert "body" not in text.lower() and "request.POST" not in text
    loggers = config.get("loggers", {})
    assert loggers.get("django.db.backends", {}).get("level", "INFO") != "DEBUG"  # SQL with parameters
    for handler in config.get("handlers", {}).values():
        assert "AdminEmailHandler" not in handler.get("class", "") or not handler.get("include_html")


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def captured_logs():
    """Every log record at DEBUG and up (the suite runs with -p no:logging, so no caplog)."""
    root, handler = logging.getLogger(), Capture()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.django_db
def test_a_whole_flow_leaves_no_password_or_token_in_the_logs(client, catalog, captured_logs):
    caplog = captured_logs
    password = "Zq8-unique-Password-4417"
    response = client.post(reverse("signup"), {"username": "carol", "password1": password, "password2": password,
                                               "email": "carol@example.org"}, follow=True)
    assert response.status_code == 200  # the page with the recovery codes
    created = client.post(reverse("token_create"), {"name": "ci"}, follow=True)
    raw = re.search(r"gpr_[A-Za-z0-9_-]{20,}", created.content.decode()).group(0)
    assert client.get(reverse("api_leases"), HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    client.post(reverse("logout"))
    client.post(reverse("login"), {"username": "carol", "password": password + "-wrong"})
    client.post(reverse("api_orders"), data='{"offer": "nope"}', content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {raw}")
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.args!r} {getattr(r, 'request', '')!r}"
                       for r in caplog.records)
    assert caplog.records  # something was logged (the failed login, the 4xx)
    assert password not in logged and raw not in logged and raw[4:20] not in logged
