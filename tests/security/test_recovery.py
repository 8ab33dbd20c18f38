"""Account recovery without e-mail: ten one-time recovery codes at
sign-up, shown once and stored only as hashes, new ones from the settings page with the
password; "forgot password" with a code (throttled per address); password reset by e-mail
where an address is set (Django's views; the console backend in development)."""
import hashlib
import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from inventory.models import AuditEntry
from rental.accounts.services import api_token_create
from rental.models import ApiToken, RecoveryCode

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery 9"
NEW = "a fresh long password 5521"


@pytest.fixture(autouse=True)
def fresh_throttles():
    cache.clear()
    yield
    cache.clear()


def codes_on(response) -> list[str]:
    return re.findall(r"<li><code>([a-z2-7-]+)</code></li>", response.content.decode())


def sign_up(client, username="nomail") -> list[str]:
    response = client.post(reverse("signup"), {"username": username, "password1": PASSWORD, "password2": PASSWORD},
                           follow=True)
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    codes = codes_on(response)
    assert len(codes) == 10 and len(set(codes)) == 10
    return codes


def recover(client, username, code, password=NEW):
    return client.post(reverse("forgot_password"), {"username": username, "code": code,
                                                    "new_password1": password, "new_password2": password})


def test_sign_up_shows_codes_once_and_stores_only_hashes(client):
    codes = sign_up(client)
    stored = set(RecoveryCode.objects.values_list("code_hash", flat=True))
    assert len(stored) == 10
    for code in codes:
        plain = code.replace("-", "")
        assert plain not in stored and hashlib.sha256(plain.encode()).hexdigest() in stored
    assert not codes_on(client.get(reverse("account_settings")))  # never shown again
    assert "10 unused recovery codes" in client.get(reverse("account_settings")).content.decode()


def test_forgot_password_with_a_code_works_once(client):
    codes = sign_up(client)
    user = User.objects.get(username="nomail")
    raw = api_token_create(customer=user, name="t")[1]
    client.post(reverse("logout"))
    anonymous = Client()
    assert anonymous.get(reverse("login")).content.decode().count(reverse("forgot_password")) == 1
    response = recover(anonymous, "nomail", codes[2].upper())  # as typed from paper
    assert response.status_code == 302 and response["Location"] == reverse("login")
    user.refresh_from_db()
    assert user.check_password(NEW)
    assert ApiToken.objects.get(customer=user).revoked_at is not None  # a new password kills tokens
    assert anonymous.get(reverse("api_leases"), HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
    assert AuditEntry.objects.filter(action="account_recover", object_id=str(user.pk), detail__codes_left=9).exists()

    response = recover(anonymous, "nomail", codes[2], password="yet another pass 7781")
    assert response.status_code == 400 and "do not match" in response.content.decode()
    user.refresh_from_db()
    assert user.check_password(NEW)


def test_a_code_of_another_account_or_a_guess_does_not_work(client, customer):
    codes = sign_up(client)
    for username, code in (("alice", codes[0]), ("nomail", "aaaa-bbbb-cccc-dddd"), ("nobody", codes[0])):
        assert recover(Client(), username, code).status_code == 400
    customer.refresh_from_db()
    assert customer.check_password(PASSWORD)


def test_weak_new_passwords_are_refused(client):
    codes = sign_up(client)
    response = recover(Client(), "nomail", codes[0], password="12345678")
    assert response.status_code == 400
    assert RecoveryCode.objects.filter(used_at__isnull=True).count() == 10  # the code is not spent


def test_guessing_is_throttled_per_address(client, settings):
    settings.RECOVERY_ATTEMPTS_PER_IP = 3
    codes = sign_up(client)
    guesser = Client(REMOTE_ADDR="203.0.113.9")
    for n in range(3):
        assert recover(guesser, "nomail", f"guess-{n}").status_code == 400
    response = recover(guesser, "nomail", codes[0])  # even a right code, once over the limit
    assert response.status_code == 429 and "Too many attempts" in response.content.decode()
    assert recover(Client(REMOTE_ADDR="198.51.100.4"), "nomail", codes[0]).status_code == 302


def test_new_codes_from_settings_need_the_password_and_replace_the_old(client):
    old = sign_up(client)
    assert client.get(reverse("recovery_codes")).status_code == 200
    assert client.post(reverse("recovery_codes"), {"password": "wrong one"}).status_code == 400
    response = client.post(reverse("recovery_codes"), {"password": PASSWORD}, follow=True)
    new = codes_on(response)
    assert response.status_code == 200 and len(new) == 10 and set(new).isdisjoint(old)
    assert recover(Client(), "nomail", old[0]).status_code == 400
    assert recover(Client(), "nomail", new[0]).status_code == 302


def test_password_reset_by_e_mail_where_an_address_is_set(client, customer, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    response = client.post(reverse("password_reset"), {"email": "alice@example.org"})
    assert response.status_code == 302 and len(mail.outbox) == 1
    link = re.search(r"http://testserver(/accounts/password/reset/\S+/)", mail.outbox[0].body).group(1)
    form = client.get(link, follow=True)
    assert form.status_code == 200 and form.context["validlink"]
    response = client.post(form.redirect_chain[-1][0], {"new_password1": NEW, "new_password2": NEW})
    assert response.status_code == 302
    customer.refresh_from_db()
    assert customer.check_password(NEW)
    # No account with that address: the same answer, and no mail.
    assert client.post(reverse("password_reset"), {"email": "nobody@example.org"}).status_code == 302
    assert len(mail.outbox) == 1

