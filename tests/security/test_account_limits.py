"""A per-username sign-in pace on top of axes' pair lock, password-reset
requests throttled, in-session password checks throttled, enrolling an authenticator
needs the password, sign-up posts throttled ("that username exists"), look-alike
usernames refused."""
import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.otp import code_for

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery 9"


def login(address, username, password):
    return Client(REMOTE_ADDR=address).post(reverse("login"), {"username": username, "password": password})


def test_guesses_at_one_username_from_many_addresses_pace_it(customer, other_customer, settings):
    """Past AXES_USERNAME_FAILURE_LIMIT the username is paced per source, never locked
    (docs/adr/0010; the owner's side in tests/security/test_login_lockout.py)."""
    settings.AXES_USERNAME_FAILURE_LIMIT = 8
    for n in range(8):  # 2 guesses from each of 4 addresses: below axes' 5 per address
        assert login(f"203.0.113.{n // 2 + 1}", "alice", f"guess {n}").status_code == 200
    assert login("203.0.113.1", "alice", "one more").status_code == 200  # a source's next guess is checked
    paced = login("203.0.113.1", "alice", PASSWORD)  # and the one after it is not, within the interval
    assert paced.status_code == 429 and "_auth_user_id" not in paced.client.session
    assert login("203.0.113.1", "ALICE", PASSWORD).status_code == 429  # nor is case a way around
    assert login("203.0.113.1", "bob", PASSWORD).status_code == 302  # other usernames are not paced
    assert login("198.51.100.50", "alice", PASSWORD).status_code == 302  # the owner, from an address of theirs


def test_password_reset_requests_are_throttled_per_address_and_per_address_mailed(customer, settings):
    settings.PASSWORD_RESETS_PER_IP, settings.PASSWORD_RESETS_PER_EMAIL = 3, 2
    mailer = Client(REMOTE_ADDR="203.0.113.5")
    answers = [mailer.post(reverse("password_reset"), {"email": "alice@example.org"}).status_code for _ in range(3)]
    assert answers == [302, 302, 429] and len(mail.outbox) == 2
    other = Client(REMOTE_ADDR="198.51.100.5")  # the victim's inbox is protected from other addresses too
    assert other.post(reverse("password_reset"), {"email": "ALICE@example.org "}).status_code == 429
    answers = [mailer.post(reverse("password_reset"), {"email": f"x{n}@example.org"}).status_code for n in range(2)]
    assert answers == [429, 429] and len(mail.outbox) == 2


def test_an_ipv6_client_is_its_64_not_each_address_it_picks(customer, settings):
    """A host gets a whole /64: a fresh address per request must not reset the count."""
    settings.PASSWORD_RESETS_PER_IP, settings.PASSWORD_RESETS_PER_EMAIL = 2, 10
    answers = [Client(REMOTE_ADDR=f"2001:db8:7:9::{n:x}").post(reverse("password_reset"), {"email": f"x{n}@example.org"})
               .status_code for n in range(1, 4)]
    assert answers == [302, 302, 429]
    neighbour = Client(REMOTE_ADDR="2001:db8:7:a::1")  # the next /64 is another client
    assert neighbour.post(reverse("password_reset"), {"email": "y@example.org"}).status_code == 302
    mapped = [Client(REMOTE_ADDR=a).post(reverse("password_reset"), {"email": f"m{a[-1]}@example.org"}).status_code
              for a in ("203.0.113.9", "::ffff:203.0.113.9", "203.0.113.9")]  # one IPv4 client, either form
    assert mapped == [302, 302, 429]


@pytest.fixture
def signed_in(customer):
    client = Client()
    assert client.post(reverse("login"), {"username": "alice", "password": PASSWORD}).status_code == 302
    return client


def test_password_checks_inside_a_session_are_throttled(signed_in, customer, settings):
    settings.PASSWORD_CHECKS_PER_USER = 3
    for _ in range(3):
        response = signed_in.post(reverse("recovery_codes"), {"password": "a guess at it"})
        assert response.status_code == 400
    assert signed_in.post(reverse("recovery_codes"), {"password": PASSWORD}).status_code == 429
    # The budget is the account's, shared by every page that checks the password.
    response = signed_in.post(reverse("password_change"), {"old_password": PASSWORD, "new_password1": "n3w pass 12345",
                                                           "new_password2": "n3w pass 12345"})
    assert response.status_code == 429
    customer.refresh_from_db()
    assert customer.check_password(PASSWORD)


def test_a_stolen_session_cannot_enrol_the_thiefs_authenticator(signed_in, customer):
    signed_in.get(reverse("otp_setup"))
    device = TOTPDevice.objects.get(user=customer, confirmed=False)
    response = signed_in.post(reverse("otp_setup"), {"code": code_for(device)})
    assert response.status_code == 400 and "password" in response.context["form"].errors
    response = signed_in.post(reverse("otp_setup"), {"code": code_for(device), "password": "not it at all"})
    assert response.status_code == 400 and not TOTPDevice.objects.filter(user=customer, confirmed=True).exists()
    response = signed_in.post(reverse("otp_setup"), {"code": code_for(device), "password": PASSWORD})
    assert response.status_code == 200 and TOTPDevice.objects.filter(user=customer, confirmed=True).exists()


def sign_up(client, username):
    return client.post(reverse("signup"), {"username": username, "password1": PASSWORD, "password2": PASSWORD})


def test_asking_whether_usernames_exist_is_throttled(customer, settings):
    settings.SIGNUP_ATTEMPTS_PER_IP = 4
    def prober():
        return Client(REMOTE_ADDR="203.0.113.8")

    answers = [sign_up(prober(), name).status_code for name in ("alice", "bob", "carol", "dave", "erin")]
    assert answers == [400, 302, 302, 302, 429]  # 302: made, on to its recovery codes
    assert "already exists" not in sign_up(prober(), "alice").content.decode()


@pytest.mark.parametrize("username", ["\u0430lice", "op\u0435rator", "\u0430l\u0456c\u0435", "ALICE", "Alice"])
def test_look_alike_usernames_are_refused(customer, username):
    User.objects.create_user(username="operator", password=PASSWORD)
    response = sign_up(Client(), username)
    assert response.status_code == 400 and "username" in response.context["form"].errors, username
    assert User.objects.count() == 2


@pytest.mark.parametrize("username", ["张伟", "Дмитрий", "müller", "alice_99"])
def test_usernames_in_one_alphabet_are_welcome(customer, username):
    assert sign_up(Client(), username).status_code == 302
    assert User.objects.filter(username=username).exists()


def test_the_latin_name_of_an_existing_look_alike_is_refused(db):
    User.objects.create_user(username="\u043e\u0440\u0435\u0445", password=PASSWORD)  # Cyrillic "opex"
    assert sign_up(Client(), "opex").status_code == 400
