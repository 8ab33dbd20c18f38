"""Sign-in limits cannot be turned against the owner (docs/adr/0010-*): guesses at a
username from many addresses put it *under attack*, and from then on each source (an IPv4
address, an IPv6 /64) may try it once per LOGIN_PACED_SOURCE_SECONDS — there is no lock an
anonymous client can renew. The owner from an address the attacker does not share gets in at
the first try (an operator with their TOTP code too), and after a typo of their own within
one interval; a browser that signed in before is not paced at all. Guessing stays slowed per
source (axes' per username + address lock, and the pace) and per account (one try per
source per interval once under attack)."""
import pytest
from django.core import signing
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from rental.accounts import login_limits
from rental.accounts.login_limits import DEVICE_COOKIE
from rental.accounts.recovery import account_recovery_codes_issue

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery 9"
STAFF_PASSWORD = "operator pass 12345"


def login(client, address, username="alice", password=PASSWORD):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=address)


def attack(round_: int):
    """The attack as reported: 20 wrong passwords from 10 addresses, 2 each (below axes' 5).
    From the 20th on the account is under attack; a later round's addresses are new, each
    gets its first guess and is paced after it."""
    for n in range(20):
        answer = login(Client(), f"203.0.{round_}.{n // 2 + 1}", password=f"guess {round_}-{n}").status_code
        assert answer == 200 if round_ == 1 else answer in (200, 429)


def assert_paced(response, settings):
    assert response.status_code == 429
    assert 0 < int(response["Retry-After"]) <= settings.LOGIN_PACED_SOURCE_SECONDS
    assert "Your password was not checked" in response.content.decode()


def owners_browser():
    browser = Client()
    assert login(browser, "192.0.2.10").status_code == 302
    assert browser.cookies[DEVICE_COOKIE].value
    browser.post(reverse("logout"))
    return browser


def test_the_owner_on_a_new_browser_and_address_gets_in_at_the_first_try_during_the_attack(customer, settings):
    for round_ in range(1, 4):  # the attacker goes on; nothing it does locks the account
        attack(round_)
        # The attacker's own addresses are paced: its next guess is checked, the one after it not.
        assert login(Client(), f"203.0.{round_}.1", password="one more guess").status_code in (200, 429)
        assert_paced(login(Client(), f"203.0.{round_}.1", password="and another"), settings)
        new_browser = Client()
        signed_in = login(new_browser, f"198.51.100.{round_ + 10}")
        assert signed_in.status_code == 302 and new_browser.session.get("_auth_user_id") == str(customer.pk)


def test_paced_tries_are_not_guesses_and_do_not_lock_the_source(customer, settings):
    """A try refused by the pace neither counts as a failure nor feeds axes' pair lock: the
    owner who clicks again and again after a typo still gets in once the interval passed."""
    from axes.models import AccessAttempt

    attack(1)
    clock = [1_000_000.0]
    settings.LOGIN_PACED_SOURCE_SECONDS = 60
    owner = Client()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(login_limits, "_clock", lambda: clock[0])
        assert login(owner, "198.51.100.60", password="a typo").status_code == 200
        for _ in range(10):
            assert_paced(login(owner, "198.51.100.60"), settings)
        assert AccessAttempt.objects.get(ip_address="198.51.100.60").failures_since_start == 1
        clock[0] += 60
        assert login(owner, "198.51.100.60").status_code == 302


def test_an_ipv6_attacker_is_paced_per_64_not_per_address(customer, settings):
    attack(1)
    assert login(Client(), "2001:db8:bad:1::1", password="guess").status_code == 200
    for n in range(2, 6):  # a fresh address of the same /64 for every try
        assert_paced(login(Client(), f"2001:db8:bad:1::{n:x}", password="guess"), settings)
    assert login(Client(), "2001:db8:0:7::1").status_code == 302   # the owner's own /64


def test_the_owners_browser_is_not_paced_at_all(customer, settings):
    browser = owners_browser()
    attack(1)
    assert login(browser, "203.0.1.1", password="a typo").status_code == 200  # even from a paced address
    assert login(browser, "203.0.1.1").status_code == 302


def test_a_known_browser_of_another_account_or_a_forged_cookie_is_paced(customer, other_customer, settings):
    attackers = Client()
    assert login(attackers, "203.0.113.200", username="bob").status_code == 302  # the attacker's own account
    attackers.post(reverse("logout"))
    attack(1)
    assert login(attackers, "203.0.113.201", password="guess").status_code == 200
    assert_paced(login(attackers, "203.0.113.201", password="guess"), settings)
    forged = Client()
    forged.cookies[DEVICE_COOKIE] = signing.dumps({"a": [customer.pk]}, salt="another salt")
    assert_paced(login(forged, "203.0.113.201", password="guess"), settings)
    unsigned = Client()
    unsigned.cookies[DEVICE_COOKIE] = f'{{"a": [{customer.pk}]}}'
    assert_paced(login(unsigned, "203.0.113.201", password="guess"), settings)


def test_a_known_browser_is_still_slowed_per_address(customer, settings):
    """The cookie lifts only the pace: guessing from it still meets axes' per username +
    address limit (429 with Retry-After), and that lock is not prolonged by more tries."""
    browser = owners_browser()
    for n in range(settings.AXES_FAILURE_LIMIT - 1):
        assert login(browser, "198.51.100.77", password=f"wrong {n}").status_code == 200
    login(browser, "198.51.100.77", password="the last wrong one")
    locked = login(browser, "198.51.100.77")
    assert locked.status_code == 429 and int(locked["Retry-After"]) == settings.AXES_COOLOFF_TIME.total_seconds()
    assert login(browser, "198.51.100.78").status_code == 302  # another address is another source


def test_recovering_the_account_from_a_new_browser_makes_it_known(customer, settings):
    codes = account_recovery_codes_issue(user=customer)
    attack(1)
    new_browser = Client()
    assert login(new_browser, "198.51.100.30", password="forgotten").status_code == 200
    assert_paced(login(new_browser, "198.51.100.30", password="forgotten too"), settings)
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
    settings.LOGIN_DEVICE_DAYS = 0  # its signature is now too old: the browser is paced like any
    attack(1)
    assert login(browser, "203.0.1.1", password="guess").status_code == 200
    assert login(browser, "203.0.1.1").status_code == 429


# --- the property: any interleaving of attackers, the owner in within one interval -------------

ATTACKERS = [f"203.0.113.{n}" for n in range(1, 9)] + [f"2001:db8:bad:{n}::{m}" for n in range(3) for m in (1, 2)]
attempt = st.tuples(st.sampled_from(ATTACKERS), st.integers(0, 90))   # (address, seconds since the last)


@pytest.mark.parametrize("who", ["customer", "operator"])
@hsettings(max_examples=12, deadline=None, derandomize=True,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(attempts=st.lists(attempt, max_size=14), burst=st.lists(st.sampled_from(ATTACKERS), max_size=4),
       primed=st.booleans(), typo=st.booleans(), owner_at=st.sampled_from(["198.51.100.50", "2001:db8:0:1::5"]))
def test_any_attack_lets_the_owner_in_within_one_interval(who, customer, operator, settings, attempts, burst, primed,
                                                           typo, owner_at):
    """Attackers try from many addresses in any order and at any pace (the account primed
    past its threshold or brought there by them), and again from `burst` addresses right
    before each of the owner's tries; the owner — from their own address, on a new browser,
    perhaps after a typo — follows each Retry-After and is in, password and (for an operator)
    TOTP code, within LOGIN_PACED_SOURCE_SECONDS and two tries of the password. (A lock per
    account, or a pace per account, fails this: the burst takes the owner's turn.)"""
    from axes.models import AccessAttempt
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from tests.otp import code_for

    cache.clear()
    AccessAttempt.objects.all().delete()
    interval = settings.LOGIN_PACED_SOURCE_SECONDS = 60
    user, password = (customer, PASSWORD) if who == "customer" else (operator, STAFF_PASSWORD)
    clock = [2_000_000.0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(login_limits, "_clock", lambda: clock[0])
        if primed:
            cache.set(login_limits.failures_key(user.username), settings.AXES_USERNAME_FAILURE_LIMIT, 900)
        owner, tries, waited = Client(), 0, 0
        if typo:
            assert login(owner, owner_at, user.username, "a typo").status_code == 200
        for address, pause in attempts:
            clock[0] += pause
            assert login(Client(), address, user.username, f"guess {pause}").status_code in (200, 429)
        while True:
            tries += 1
            for address in burst:
                login(Client(), address, user.username, "a guess just before the owner")
            answer = login(owner, owner_at, user.username, password)
            if answer.status_code == 302:
                break
            assert answer.status_code == 429 and tries < 2, answer.status_code
            waited += int(answer["Retry-After"])
            clock[0] += int(answer["Retry-After"])
        assert waited <= interval and owner.session.get("_auth_user_id") == str(user.pk)
        if who == "operator":
            device = TOTPDevice.objects.get(user=user)
            TOTPDevice.objects.filter(pk=device.pk).update(last_t=-1)  # each example's owner is a first use
            device.refresh_from_db()
            device.throttle_reset()
            verified = owner.post(reverse("otp_verify"), {"code": code_for(device), "next": "/admin/"},
                                  REMOTE_ADDR=owner_at)
            assert verified.status_code == 302 and owner.get("/admin/", REMOTE_ADDR=owner_at).status_code == 200
