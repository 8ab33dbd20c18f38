import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from inventory.models import AuditEntry

GOOD_PASSWORD = "violet-tractor-47-sunrise"


def test_signup_with_username_and_password_only(client, db):
    response = client.post(reverse("signup"), {"username": "anon1", "password1": GOOD_PASSWORD,
                                               "password2": GOOD_PASSWORD}, follow=True)
    # It redirects to the account recovery codes, shown once (tests/security/test_recovery.py).
    assert response.status_code == 200 and response.content.decode().count("<li><code>") == 10
    user = User.objects.get(username="anon1")
    assert user.email == "" and user.password.startswith(("md5$", "argon2"))
    assert AuditEntry.objects.filter(action="account_create", object_id=str(user.pk)).exists()
    assert client.get(reverse("home")).context["user"] == user


def test_signup_rejects_weak_password_with_message(client, db):
    response = client.post(reverse("signup"), {"username": "anon2", "password1": "12345678",
                                               "password2": "12345678"})
    assert response.status_code == 400
    assert "too short" in response.content.decode() or "too common" in response.content.decode()
    assert not User.objects.filter(username="anon2").exists()


def test_production_hasher_is_argon2():
    from storefront import settings

    assert settings.PASSWORD_HASHERS[0].endswith("Argon2PasswordHasher")


def test_login_logout_and_password_change(client, customer):
    response = client.post(reverse("login"), {"username": "alice", "password": "correct horse battery 9"})
    assert response.status_code == 302
    response = client.post(reverse("password_change"), {
        "old_password": "correct horse battery 9", "new_password1": GOOD_PASSWORD, "new_password2": GOOD_PASSWORD})
    assert response.status_code == 302
    customer.refresh_from_db()
    assert customer.check_password(GOOD_PASSWORD)
    client.post(reverse("logout"))
    assert not client.get(reverse("home")).context["user"].is_authenticated


def test_login_is_throttled_after_repeated_failures(client, customer, settings):
    statuses = [
        client.post(reverse("login"), {"username": "alice", "password": "wrong"},
                    REMOTE_ADDR="10.9.9.9").status_code
        for _ in range(settings.AXES_FAILURE_LIMIT)
    ]
    assert statuses == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]
    locked = client.post(reverse("login"), {"username": "alice", "password": "correct horse battery 9"},
                         REMOTE_ADDR="10.9.9.9")
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    # Another address is not locked out of the account.
    ok = client.post(reverse("login"), {"username": "alice", "password": "correct horse battery 9"},
                     REMOTE_ADDR="10.9.9.10")
    assert ok.status_code == 302


@pytest.mark.parametrize("path", ["/admin/", "/admin/inventory/node/", "/admin/inventory/gpumodel/",
                                  "/admin/inventory/offer/", "/admin/inventory/site/",
                                  "/admin/inventory/interconnect/", "/admin/inventory/storageproduct/",
                                  "/admin/inventory/slotallocation/", "/admin/inventory/auditentry/"])
def test_admin_pages_load_for_staff_and_are_refused_to_customers(client, catalog, operator, customer, path):
    client.force_login(customer)
    refused = client.get(path)
    assert refused.status_code == 302 and "/admin/login/" in refused["Location"]
    client.force_login(operator)
    assert client.get(path).status_code == 200


def test_admin_drain_action(client, catalog, operator):
    from inventory.models import Node

    node = Node.objects.get(gpu_model__slug="mi300x")
    client.force_login(operator)
    response = client.post("/admin/inventory/node/", {"action": "drain", "_selected_action": [node.pk]})
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.draining
