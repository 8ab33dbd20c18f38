"""Two-factor sign-in: required for staff, an optional TOTP for customers.

Staff must enrol TOTP before anything else; whoever enrolled must give a code after the
password before anything else (password change included); replacing the authenticator
needs a code from the current one or a recovery code; recovery codes are shown once and
can be made anew. These tests log in through the real pages (password, then code)."""
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from inventory.models import AuditEntry
from tests.otp import code_for

pytestmark = pytest.mark.django_db
STAFF_PASSWORD = "operator pass 12345"


@pytest.fixture
def bare_operator(db, django_user_model):
    """A superuser as create_operator makes it: no authenticator yet."""
    return django_user_model.objects.create_superuser(username="newop", password=STAFF_PASSWORD)


def password_login(client, username, password=STAFF_PASSWORD):
    response = client.post(reverse("login"), {"username": username, "password": password})
    assert response.status_code == 302, response.content[:500]


def enrol(client, user, **extra) -> tuple[TOTPDevice, list[str]]:
    page = client.get(reverse("otp_setup"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "<svg" in html and re.search(r"<code class=\"secret\">[A-Z2-7=]{32,}</code>", html)
    device = TOTPDevice.objects.get(user=user, confirmed=False)
    response = client.post(reverse("otp_setup"), {"code": code_for(device), "password": STAFF_PASSWORD, **extra})
    assert response.status_code == 200, response.content[:800]
    assert response["Cache-Control"] == "no-store"
    codes = re.findall(r"<li><code>([a-z2-7-]+)</code></li>", response.content.decode())
    device.refresh_from_db()
    assert device.confirmed and len(codes) == 10
    return device, codes


def give_code(client, device, next_url="/admin/"):
    """The verify step with the authenticator's code (the next step's code when the current
    one was spent already, e.g. at enrolment)."""
    device.refresh_from_db()
    device.throttle_reset()  # a wrong code before locks the device for a second or more
    response = client.post(reverse("otp_verify"), {"code": code_for(device, 1), "next": next_url})
    if response.status_code != 302:  # clock edge: the next step is not valid yet
        response = client.post(reverse("otp_verify"), {"code": code_for(device), "next": next_url})
    return response


def test_staff_without_a_device_reach_nothing_but_enrolment(client, bare_operator, catalog):
    password_login(client, "newop")
    for path in ("/admin/", "/admin/rental/lease/", "/admin/ops/exports/", reverse("lease_list"),
                 reverse("account_settings"), reverse("password_change"), reverse("otp_recovery_codes")):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith(reverse("otp_setup")), path
    response = client.post(reverse("password_change"), {"old_password": STAFF_PASSWORD, "new_password1": "x" * 20,
                                                        "new_password2": "x" * 20})
    assert response.status_code == 302 and response["Location"].startswith(reverse("otp_setup"))
    bare_operator.refresh_from_db()
    assert bare_operator.check_password(STAFF_PASSWORD)

    enrol(client, bare_operator)
    assert client.get("/admin/").status_code == 200
    assert AuditEntry.objects.filter(action="otp_enrol", object_id=str(bare_operator.pk)).exists()


def test_enrolment_needs_a_right_code(client, bare_operator):
    password_login(client, "newop")
    client.get(reverse("otp_setup"))
    device = TOTPDevice.objects.get(user=bare_operator, confirmed=False)
    wrong = f"{(int(code_for(device)) + 1) % 1_000_000:06d}"
    response = client.post(reverse("otp_setup"), {"code": wrong, "password": STAFF_PASSWORD})
    assert response.status_code == 400 and not TOTPDevice.objects.filter(confirmed=True).exists()
    assert "<svg" in response.content.decode()


def test_enrolled_staff_with_only_a_password_can_change_nothing(client, bare_operator):
    password_login(client, "newop")
    device, _codes = enrol(client, bare_operator)
    client.logout()

    password_login(client, "newop")
    for path in ("/admin/", "/admin/rental/lease/", reverse("account_settings"), reverse("password_change")):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith(reverse("otp_verify")), path
    response = client.post(reverse("password_change"), {"old_password": STAFF_PASSWORD,
                                                        "new_password1": "attacker pass 98765",
                                                        "new_password2": "attacker pass 98765"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("otp_verify"))
    response = client.get(reverse("otp_setup"))  # a password alone cannot enrol the attacker's phone
    assert response.status_code == 302 and response["Location"].startswith(reverse("otp_verify"))
    bare_operator.refresh_from_db()
    assert bare_operator.check_password(STAFF_PASSWORD)
    assert TOTPDevice.objects.filter(user=bare_operator).count() == 1

    assert client.post(reverse("otp_verify"), {"code": "000000", "next": "/admin/"}).status_code == 400
    response = give_code(client, device)
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_a_recovery_code_passes_the_code_step_once(client, bare_operator):
    password_login(client, "newop")
    _device, codes = enrol(client, bare_operator)
    client.logout()
    password_login(client, "newop")
    response = client.post(reverse("otp_verify"), {"code": codes[0].upper(), "next": "/admin/"})
    assert response.status_code == 302 and response["Location"] == "/admin/"
    client.logout()
    password_login(client, "newop")
    assert client.post(reverse("otp_verify"), {"code": codes[0], "next": "/admin/"}).status_code == 400
    assert StaticToken.objects.filter(device__user=bare_operator).count() == 9


def test_a_new_authenticator_needs_the_current_one_or_a_recovery_code(client, bare_operator):
    password_login(client, "newop")
    old, codes = enrol(client, bare_operator)
    # The session is verified, yet a new device still needs proof from the current one.
    client.get(reverse("otp_setup"))
    new = TOTPDevice.objects.get(user=bare_operator, confirmed=False)
    response = client.post(reverse("otp_setup"), {"code": code_for(new), "password": STAFF_PASSWORD})
    assert response.status_code == 400
    response = client.post(reverse("otp_setup"), {"code": code_for(new), "current_code": "12345678",
                                                    "password": STAFF_PASSWORD})
    assert response.status_code == 400 and not TOTPDevice.objects.filter(pk=new.pk, confirmed=True).exists()

    StaticDevice.objects.get(user=bare_operator).throttle_reset()  # the wrong code locked it for a second
    replaced, new_codes = enrol(client, bare_operator, current_code=codes[3])
    assert replaced.pk == new.pk
    assert list(TOTPDevice.objects.filter(user=bare_operator).values_list("pk", flat=True)) == [new.pk]
    assert set(new_codes).isdisjoint(codes)  # fresh codes replace the old ones


def test_recovery_codes_can_be_made_anew_with_a_code(client, bare_operator):
    password_login(client, "newop")
    _device, codes = enrol(client, bare_operator)
    assert client.get(reverse("otp_recovery_codes")).status_code == 200
    assert client.post(reverse("otp_recovery_codes"), {"current_code": "nope"}).status_code == 400
    StaticDevice.objects.get(user=bare_operator).throttle_reset()
    response = client.post(reverse("otp_recovery_codes"), {"current_code": codes[0]})
    fresh = re.findall(r"<li><code>([a-z2-7-]+)</code></li>", response.content.decode())
    assert response.status_code == 200 and len(fresh) == 10 and set(fresh).isdisjoint(codes)
    assert StaticToken.objects.filter(device__user=bare_operator).count() == 10


def test_verify_refuses_offsite_next(client, bare_operator):
    password_login(client, "newop")
    device, _codes = enrol(client, bare_operator)
    client.logout()
    password_login(client, "newop")
    response = give_code(client, device, next_url="https://evil.example/")
    assert response.status_code == 302 and response["Location"] == reverse("admin:index")


def test_staff_cannot_turn_two_factor_off(client, operator):
    client.force_login(operator)
    assert client.post(reverse("otp_disable"), {"current_code": "123456"}).status_code == 403


def test_customers_choose_two_factor_and_then_need_a_code(client, customer):
    password_login(client, "alice", "correct horse battery 9")
    assert client.get(reverse("account_settings")).status_code == 200  # optional for customers
    device, codes = enrol(client, customer, password="correct horse battery 9")
    client.logout()

    password_login(client, "alice", "correct horse battery 9")
    response = client.get(reverse("lease_list"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("otp_verify"))
    response = give_code(client, device, next_url=reverse("lease_list"))
    assert response.status_code == 302 and response["Location"] == reverse("lease_list")

    assert client.post(reverse("otp_disable"), {"current_code": "nope"}).status_code == 400
    StaticDevice.objects.get(user=customer).throttle_reset()
    response = client.post(reverse("otp_disable"), {"current_code": codes[1]})
    assert response.status_code == 302 and not TOTPDevice.objects.filter(user=customer).exists()
    client.logout()
    password_login(client, "alice", "correct horse battery 9")
    assert client.get(reverse("lease_list")).status_code == 200


def test_customers_cannot_reach_the_admin(client, customer):
    client.force_login(customer)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 302 and reverse("admin:login") in response["Location"]
    assert client.get("/admin/rental/lease/").status_code == 302


def test_create_operator_says_enrolment_is_required(db):
    out = StringIO()
    call_command("create_operator", "--username", "boss", stdout=out)
    assert "Two-factor sign-in is required" in out.getvalue()
    anonymous = Client()
    password = re.search(r"password: (\S+)", out.getvalue()).group(1)
    password_login(anonymous, "boss", password)
    assert anonymous.get("/admin/")["Location"].startswith(reverse("otp_setup"))


def _heads(response) -> tuple[str, str]:
    page = response.content.decode()
    return (re.search(r"<title>(.*?)</title>", page, re.S).group(1).strip(), re.search(r"<h1>(.*?)</h1>", page).group(1))


def test_the_two_kinds_of_codes_are_named_apart(client, bare_operator):
    """Two-factor backup codes pass the code step; password recovery codes set a new password.
    Each page's title and heading say which, and none is shared between the two."""
    password_login(client, "newop")
    _device, _codes = enrol(client, bare_operator)
    two_factor = [_heads(client.get(reverse("otp_recovery_codes")))]
    password = [_heads(client.get(reverse("recovery_codes")))]
    assert all("two-factor backup codes" in title.lower() and "two-factor backup codes" in h1.lower()
               for title, h1 in two_factor), two_factor
    assert all("password recovery codes" in title.lower() and "password recovery codes" in h1.lower()
               for title, h1 in password), password
    settings_page = client.get(reverse("account_settings")).content.decode()
    assert "New two-factor backup codes" in settings_page and "Make new password recovery codes" in settings_page
