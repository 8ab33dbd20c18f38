"""Two-factor helpers for tests. Codes come from django_otp's own TOTP implementation, as
an authenticator app would make them.

`TwoFactorClient.force_login` marks the session as having passed the code step when the
user has an authenticator, just as force_login skips the password: tests of the code step
itself (tests/security/test_admin_otp.py) log in through the real pages instead."""
import time

from django.test import Client
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice


def code_for(device: TOTPDevice, offset_steps: int = 0) -> str:
    """The code an authenticator app shows now (or offset_steps steps later)."""
    generator = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    generator.time = time.time() + offset_steps * device.step
    return f"{generator.token():0{device.digits}d}"


def authenticator_for(user) -> TOTPDevice:
    return TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)


class TwoFactorClient(Client):
    def force_login(self, user, backend=None):
        super().force_login(user, backend)
        device = TOTPDevice.objects.filter(user=user, confirmed=True).first()
        if device is not None:
            session = self.session
            session[DEVICE_ID_SESSION_KEY] = device.persistent_id
            session.save()
