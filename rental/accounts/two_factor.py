"""Two-factor sign-in (django-otp): one TOTP authenticator per account plus one-time
recovery codes (django-otp's static device), for staff (mandatory) and customers (optional).

Every write goes through a service here and leaves an audit row. Recovery codes are shown
once, when they are issued; django-otp keeps them so that `StaticDevice.verify_token` can
consume them (throttled, one use each)."""
import base64
import secrets

from django.contrib.auth.models import User
from django.db import transaction
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from inventory.audit import audit_record

PENDING = "pending (unconfirmed)"
AUTHENTICATOR = "authenticator"
RECOVERY = "recovery codes"
RECOVERY_CODE_COUNT = 10


def normalize_code(code: str) -> str:
    """Codes may be typed with spaces or dashes, recovery codes in any case."""
    return "".join(code.split()).replace("-", "").lower()


def display_code(code: str) -> str:
    return "-".join(code[i:i + 4] for i in range(0, len(code), 4))


def is_enrolled(user) -> bool:
    return TOTPDevice.objects.filter(user=user, confirmed=True).exists()


def pending_device(user) -> TOTPDevice:
    device = TOTPDevice.objects.filter(user=user, confirmed=False, name=PENDING).first()
    return device or TOTPDevice.objects.create(user=user, name=PENDING, confirmed=False)


@transaction.atomic
def matching_device(user, code: str):
    """The confirmed device (authenticator, or recovery codes) that accepts `code`, or None.
    A recovery code is consumed by the match; a TOTP code cannot be replayed. The device
    rows are locked while the code is checked and spent: six sessions sending one
    code at once queue here, and each one after the first sees it used."""
    code = normalize_code(code)
    if not code:
        return None
    if code.isdigit() and len(code) == 6:
        devices = TOTPDevice.objects.select_for_update().filter(user=user, confirmed=True).order_by("pk")
    else:
        devices = StaticDevice.objects.select_for_update().filter(user=user, confirmed=True).order_by("pk")
    for device in devices:
        if device.verify_token(code):
            return device
    return None


@transaction.atomic
def recovery_codes_issue(*, user: User, actor: User | None = None) -> list[str]:
    """Fresh recovery codes replacing any old ones; returned for showing once."""
    device, _created = StaticDevice.objects.get_or_create(user=user, name=RECOVERY, defaults={"confirmed": True})
    device.token_set.all().delete()
    codes = [base64.b32encode(secrets.token_bytes(10)).decode().lower() for _ in range(RECOVERY_CODE_COUNT)]
    StaticToken.objects.bulk_create([StaticToken(device=device, token=code) for code in codes])
    audit_record(actor=actor or user, action="otp_recovery_codes_issue", obj=user, detail={"count": len(codes)})
    return [display_code(code) for code in codes]


@transaction.atomic
def two_factor_enrol(*, user: User, device: TOTPDevice) -> list[str]:
    """Confirms the pending authenticator, replacing any earlier one (a lost phone stops
    working), and issues fresh recovery codes, which are returned to be shown once."""
    TOTPDevice.objects.filter(user=user).exclude(pk=device.pk).delete()
    TOTPDevice.objects.filter(pk=device.pk).update(confirmed=True, name=AUTHENTICATOR)
    device.refresh_from_db()
    audit_record(actor=user, action="otp_enrol", obj=user, detail={"device": device.persistent_id})
    return recovery_codes_issue(user=user)


@transaction.atomic
def two_factor_disable(*, user: User) -> None:
    """Customers may turn two-factor sign-in off again (staff may not: the view refuses)."""
    TOTPDevice.objects.filter(user=user).delete()
    StaticDevice.objects.filter(user=user).delete()
    audit_record(actor=user, action="otp_disable", obj=user)
