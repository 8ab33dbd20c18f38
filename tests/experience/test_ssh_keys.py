"""Saved SSH keys: several, named, validated and fingerprinted like ssh-keygen; chosen at
ordering (the newest preselected), copied into the lease, private to their owner."""
import base64
import hashlib

import pytest
from django.urls import reverse

from rental.models import Lease, SshKey
from tests.factories import ED25519, RSA_1024, form_data, order_url

ED25519_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEk3pGq+6S8q2J0iGx8nUQmCkY6Xz2Jr4o3cF8pUQxLr bob@desk"


@pytest.fixture
def alice(client, customer):
    client.force_login(customer)
    return client


def _save(client, key, name=""):
    return client.post(reverse("ssh_key_create"), {"name": name, "public_key": key})


def test_keys_are_saved_named_and_fingerprinted_like_ssh_keygen(alice, customer):
    assert _save(alice, ED25519, "laptop").status_code == 302
    assert _save(alice, ED25519_B).status_code == 302  # no name: the key's comment
    keys = {k.name: k for k in SshKey.objects.filter(customer=customer)}
    assert set(keys) == {"laptop", "bob@desk"}
    blob = base64.b64decode(ED25519.split()[1])
    assert keys["laptop"].fingerprint == "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    page = alice.get(reverse("account_settings")).content.decode()
    assert "laptop" in page and keys["laptop"].fingerprint in page


@pytest.mark.parametrize("key,name,why", [(RSA_1024, "old", "2048"), ("not a key", "x", "Unsupported"),
                                          (ED25519, "laptop", "saved already")])
def test_bad_or_duplicate_keys_are_refused_with_a_reason(alice, customer, key, name, why):
    _save(alice, ED25519, "laptop")
    response = _save(alice, key, name)
    assert response.status_code == 400 and why in response.content.decode()
    assert SshKey.objects.filter(customer=customer).count() == 1


def test_order_preselects_the_newest_saved_key_and_copies_it_into_the_lease(alice, catalog, customer):
    _save(alice, ED25519, "laptop")
    _save(alice, ED25519_B, "desk")
    page = alice.get(order_url()).content.decode()
    desk = SshKey.objects.get(name="desk")
    assert f'value="{desk.pk}" selected' in page
    response = alice.post(order_url(), form_data(ssh_public_key="", saved_key=str(desk.pk)))
    assert response.status_code == 302
    assert Lease.objects.get().ssh_public_key == desk.public_key


def test_a_pasted_key_wins_over_the_saved_one(alice, catalog, customer):
    _save(alice, ED25519_B, "desk")
    alice.post(order_url(), form_data(saved_key=str(SshKey.objects.get().pk)))  # form_data pastes ED25519
    assert Lease.objects.get().ssh_public_key == ED25519


def test_another_customers_key_cannot_be_chosen_or_deleted(client, catalog, customer, other_customer):
    client.force_login(other_customer)
    _save(client, ED25519_B, "bobs")
    bobs = SshKey.objects.get()
    client.force_login(customer)
    response = client.post(order_url(), form_data(ssh_public_key="", saved_key=str(bobs.pk)))
    assert response.status_code == 400 and not Lease.objects.exists()
    assert client.post(reverse("ssh_key_delete", args=[bobs.pk])).status_code == 404
    assert SshKey.objects.filter(pk=bobs.pk).exists()


def test_deleting_a_saved_key_leaves_running_leases_alone(alice, catalog, customer):
    _save(alice, ED25519, "laptop")
    key = SshKey.objects.get()
    alice.post(order_url(), form_data(ssh_public_key="", saved_key=str(key.pk)))
    alice.post(reverse("ssh_key_delete", args=[key.pk]))
    assert not SshKey.objects.exists() and Lease.objects.get().ssh_public_key == ED25519
