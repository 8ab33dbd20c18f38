"""Operators can turn on TOTP two-factor for the admin: enrol on /accounts/otp/setup/
(QR as inline SVG, confirm with a code); from then on the admin asks for a code after the
password. Codes come from django_otp's own TOTP implementation, as an app would make them."""
import re
import time

import pytest
from django.urls import reverse
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

pytestmark = pytest.mark.django_db


def code_for(device: TOTPDevice, offset_steps: int = 0) -> str:
    """The code an authenticator app shows now (or offset_steps steps later)."""
    generator = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    generator.time = time.time() + offset_steps * device.step
    return f"{generator.token():0{device.digits}d}"


def admin_login(client, operator):
    response = client.post(reverse("admin:login") + "?next=/admin/",
                           {"username": "op", "password": "operator pass 12345", "next": "/admin/"})
    assert response.status_code == 302, response.content[:500]
    return response


def enrol(client, operator) -> TOTPDevice:
    page = client.get(reverse("otp_setup"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "<svg" in html and re.search(r"<code class=\"secret\">[A-Z2-7=]{32,}</code>", html)
    device = TOTPDevice.objects.get(user=operator, confirmed=False)
    response = client.post(reverse("otp_setup"), {"code": code_for(device)})
    assert response.status_code == 302 and response["Location"] == reverse("admin:index")
    device.refresh_from_db()
    assert device.confirmed
    return device


def test_staff_without_a_device_keep_password_only_access(client, operator):
    admin_login(client, operator)
    assert client.get(reverse("admin:index")).status_code == 200


def test_enrolment_shows_a_qr_code_and_needs_a_right_code(client, operator):
    admin_login(client, operator)
    client.get(reverse("otp_setup"))
    device = TOTPDevice.objects.get(user=operator, confirmed=False)
    wrong = f"{(int(code_for(device)) + 1) % 1_000_000:06d}"
    response = client.post(reverse("otp_setup"), {"code": wrong})
    assert response.status_code == 400 and not TOTPDevice.objects.filter(confirmed=True).exists()
    assert "<svg" in response.content.decode()  # a fresh QR for another try


def test_after_enrolment_the_admin_asks_for_a_code(client, operator):
    admin_login(client, operator)
    device = enrol(client, operator)
    client.logout()

    admin_login(client, operator)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("otp_verify"))
    assert client.get("/admin/rental/lease/").status_code == 302  # every admin page, not just the index
    assert client.post(reverse("otp_verify"), {"code": "000000", "next": "/admin/"}).status_code == 400
    assert client.get(reverse("admin:index")).status_code == 302
    # the current code (the one used at enrolment is spent; take the next step's)
    device.refresh_from_db()
    device.throttle_reset()
    response = client.post(reverse("otp_verify"), {"code": code_for(device, 1), "next": "/admin/"})
    if response.status_code != 302:  # clock edge: the next step is not valid yet
        response = client.post(reverse("otp_verify"), {"code": code_for(device), "next": "/admin/"})
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert client.get(reverse("admin:index")).status_code == 200


def test_a_password_alone_cannot_enrol_a_second_device(client, operator):
    admin_login(client, operator)
    enrol(client, operator)
    client.logout()
    admin_login(client, operator)
    response = client.get(reverse("otp_setup"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("otp_verify"))


def test_verify_refuses_offsite_next(client, operator):
    admin_login(client, operator)
    device = enrol(client, operator)
    client.logout()
    admin_login(client, operator)
    device.refresh_from_db()
    response = client.post(reverse("otp_verify"), {"code": code_for(device, 1), "next": "https://evil.example/"})
    if response.status_code != 302:
        response = client.post(reverse("otp_verify"), {"code": code_for(device), "next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == reverse("admin:index")


def test_customers_cannot_reach_enrolment_or_the_admin(client, customer):
    client.force_login(customer)
    assert client.get(reverse("otp_setup")).status_code == 302
    response = client.get(reverse("admin:index"))
    assert response.status_code == 302 and reverse("admin:login") in response["Location"]
    assert client.get("/admin/rental/lease/").status_code == 302
