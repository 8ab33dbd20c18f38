"""Sign-in limits cannot be turned against the owner: guesses at a username from many
addresses lock it for unknown browsers only; the owner's browser, known from an earlier
sign-in (a signed cookie) or from recovering the account, gets in during the attack however
often the attacker renews it. Guessing stays slowed per source (axes' per username +
address lock) and per account (unknown browsers)."""
import pytest
from django.core import signing
from django.test import Client
from django.urls import reverse

from rental.accounts.login_limits import DEVICE_COOKIE
from rental.accounts.recovery import account_recovery_codes_issue

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery 9"


def login(client, address, username="alice", password=PASSWORD):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=address)


def attack(round_: int):
    """The attack as reported: 20 wrong passwords from 10 addresses, 2 each (below axes' 5);
    a later round renews the lock (locked attempts count too)."""
    for n in range(20):
        answer = login(Client(), f"203.0.{round_}.{n // 2 + 1}", password=f"guess {round_}-{n}").status_code
        assert answer == 200 if round_ == 1 else answer in (200, 429)


def owners_browser():
    browser = Client()
    assert login(browser, "192.0.2.10").status_code == 302
    assert browser.cookies[DEVICE_COOKIE].value
    browser.post(reverse("logout"))
    return browser


def test_the_owners_browser_signs_in_during_the_attack_however_often_it_is_renewed(customer):
    browser = owners_browser()
    for round_ in range(1, 4):  # the attacker renews the lock; the owner keeps getting in
        attack(round_)
        assert login(Client(), "198.51.100.1").status_code == 429  # an unknown browser is still locked out
        signed_in = login(browser, f"198.51.100.{round_ + 10}")  # the owner, travelling: a new address
        assert signed_in.status_code == 302 and browser.session.get("_auth_user_id") == str(customer.pk)
        browser.post(reverse("logout"))


def test_a_known_browser_of_another_account_or_a_forged_cookie_does_not_unlock(customer, other_customer):
    attackers = Client()
    assert login(attackers, "203.0.113.200", username="bob").status_code == 302  # the attacker's own account
    attackers.post(reverse("logout"))
    attack(1)
    assert login(attackers, "203.0.113.201").status_code == 429
    forged = Client()
    forged.cookies[DEVICE_COOKIE] = signing.dumps({"a": [customer.pk]}, salt="another salt")
    assert login(forged, "203.0.113.202").status_code == 429
    unsigned = Client()
    unsigned.cookies[DEVICE_COOKIE] = f'{{"a": [{customer.pk}]}}'
    assert login(unsigned, "203.0.113.203").status_code == 429


def test_a_known_browser_is_still_slowed_per_address(customer, settings):
    """The cookie lifts only the per-account lock: guessing from it still meets axes'
    per username + address limit."""
    browser = owners_browser()
    for n in range(settings.AXES_FAILURE_LIMIT - 1):
        assert login(browser, "198.51.100.77", password=f"wrong {n}").status_code == 200
    login(browser, "198.51.100.77", password="the last wrong one")
    assert login(browser, "198.51.100.77").status_code == 429
    assert login(browser, "198.51.100.78").status_code == 302  # another address is another source


def test_recovering_the_account_from_a_new_browser_lets_the_owner_in_during_the_attack(customer):
    codes = account_recovery_codes_issue(user=customer)
    attack(1)
    new_browser = Client()
    assert login(new_browser, "198.51.100.30").status_code == 429
    new_password = "a brand new pass 4471"
    recovered = new_browser.post(reverse("forgot_password"), {
        "username": "alice", "code": codes[0], "new_password1": new_password, "new_password2": new_password},
        REMOTE_ADDR="198.51.100.30")
    assert recovered.status_code == 302
    attack(2)
    assert login(new_browser, "198.51.100.30", password=new_password).status_code == 302


def test_the_cookie_expires_after_the_named_setting(customer, settings):
    browser = owners_browser()
    assert int(browser.cookies[DEVICE_COOKIE]["max-age"]) == settings.LOGIN_DEVICE_DAYS * 86400
    settings.LOGIN_DEVICE_DAYS = 0  # its signature is now too old
    attack(1)
    assert login(browser, "198.51.100.40").status_code == 429
