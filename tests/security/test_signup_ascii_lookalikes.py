"""Sign-up refuses ASCII look-alikes of existing usernames — `aIice` (a capital I) for
`alice`, `0perator` (a zero) for `operator`, `rnallory` for `mallory` — with a message that
says why; names that merely share letters stay welcome."""
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from rental.accounts.usernames import ascii_skeleton

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery 9"


def sign_up(username):
    return Client().post(reverse("signup"), {"username": username, "password1": PASSWORD, "password2": PASSWORD})


@pytest.fixture
def existing(customer):
    for name in ("operator", "mallory", "Wolf1"):
        User.objects.create_user(username=name, password=PASSWORD)


@pytest.mark.parametrize("username", ["aIice", "AIice", "a1ice", "0perator", "OPERAT0R",
                                      "0pErator", "rnallory", "ma1lory", "VVolfl", "wo1fI"])
def test_ascii_look_alikes_of_existing_usernames_are_refused(existing, username):
    response = sign_up(username)
    assert response.status_code == 400, username
    errors = response.context["form"].errors["username"]
    assert any("looks like an existing one" in e and "I and l" in e for e in errors), errors
    assert not User.objects.filter(username=username).exists()


@pytest.mark.parametrize("username", ["aiice", "alice2", "operators", "malory", "wolf", "Olga", "l0la"])
def test_names_that_only_share_letters_are_welcome(existing, username):
    assert sign_up(username).status_code == 302, username
    assert User.objects.filter(username=username).exists()


def test_the_skeleton_folds_case_sensitive_ascii_twins():
    assert ascii_skeleton("aIice") == ascii_skeleton("alice") == "alice"
    assert ascii_skeleton("0perator") == ascii_skeleton("Operator") == "operator"
    assert ascii_skeleton("rnallory") == "mallory" and ascii_skeleton("aiice") == "aiice"
