"""Input validators shared by the order form and the JSON API.

An OpenSSH public key line is `<type> <base64 blob> [comment]`. The blob is the key in
SSH wire format (RFC 4253 §6.6): a length-prefixed string naming the type again, then
the key's fields. We parse it instead of trusting the text so that garbage, a blob of
another type, a truncated key or a short RSA modulus are refused with a clear message.
"""
import base64
import binascii

from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _

MIN_RSA_BITS = 2048
ED25519_KEY_BYTES = 32
ECDSA_CURVES = {
    "ecdsa-sha2-nistp256": "nistp256",
    "ecdsa-sha2-nistp384": "nistp384",
    "ecdsa-sha2-nistp521": "nistp521",
}
ACCEPTED_TYPES = ("ssh-ed25519", *ECDSA_CURVES, "ssh-rsa")
MAX_KEY_LINE = 16_384


class _Malformed(Exception):
    pass


class _Reader:
    """Reads SSH wire-format strings (uint32 length + bytes) from a blob."""

    def __init__(self, blob: bytes):
        self.blob, self.pos = blob, 0

    def string(self) -> bytes:
        if self.pos + 4 > len(self.blob):
            raise _Malformed
        size = int.from_bytes(self.blob[self.pos:self.pos + 4], "big")
        start, self.pos = self.pos + 4, self.pos + 4 + size
        if self.pos > len(self.blob):
            raise _Malformed
        return self.blob[start:self.pos]

    def mpint(self) -> int:
        raw = self.string()
        if raw and raw[0] & 0x80:
            raise _Malformed  # negative: never valid in a public key
        return int.from_bytes(raw, "big")

    def done(self) -> bool:
        return self.pos == len(self.blob)


def _decode(blob_text: str) -> bytes:
    try:
        return base64.b64decode(blob_text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise ValidationError(_("The key's base64 part is not valid base64."), code="ssh_base64") from exc


def _check_blob(key_type: str, blob: bytes) -> None:
    reader = _Reader(blob)
    try:
        if reader.string() != key_type.encode():
            raise ValidationError(_("The key data does not match its type “%(type)s”.") % {"type": key_type},
                                  code="ssh_type_mismatch")
        if key_type == "ssh-ed25519":
            ok = len(reader.string()) == ED25519_KEY_BYTES
        elif key_type == "ssh-rsa":
            exponent, modulus = reader.mpint(), reader.mpint()
            if exponent < 3 or modulus.bit_length() < MIN_RSA_BITS:
                raise ValidationError(
                    _("This RSA key has %(bits)d bits; at least %(min)d are required.")
                    % {"bits": modulus.bit_length(), "min": MIN_RSA_BITS}, code="ssh_rsa_short")
            ok = True
        else:
            ok = reader.string() == ECDSA_CURVES[key_type].encode() and len(reader.string()) > 0
        if not ok or not reader.done():
            raise _Malformed
    except _Malformed as exc:
        raise ValidationError(_("The key data is truncated or malformed."), code="ssh_malformed") from exc


def validate_ssh_public_key(value: str) -> str:
    """Returns the key line normalised to one line; raises ValidationError with a message."""
    line = " ".join((value or "").split())
    if not line:
        raise ValidationError(_("Paste your SSH public key."), code="ssh_empty")
    if "PRIVATE KEY" in line or line.startswith("PuTTY-User-Key-File"):
        raise ValidationError(_(
            "This is a private key, not the public one. It was not saved; treat it as exposed: make a new key "
            "pair and paste its public key (the .pub file, one line starting with ssh-ed25519)."),
            code="ssh_private")
    if len(line) > MAX_KEY_LINE:
        raise ValidationError(_("This is too long to be an SSH public key."), code="ssh_too_long")
    parts = line.split(" ", 2)
    if parts[0] not in ACCEPTED_TYPES:
        raise ValidationError(
            _("Unsupported key type “%(type)s”: use ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa "
              "(2048 bits or more).") % {"type": parts[0][:40]}, code="ssh_type")
    if len(parts) < 2:
        raise ValidationError(_("The key is missing its base64 part."), code="ssh_base64")
    _check_blob(parts[0], _decode(parts[1]))
    return line


def ssh_key_fingerprint(line: str) -> str:
    """`SHA256:…` of the key blob, exactly as `ssh-keygen -lf` prints it."""
    import base64
    import hashlib

    digest = hashlib.sha256(base64.b64decode(line.split(" ")[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
