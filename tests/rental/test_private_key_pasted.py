"""A private key pasted where the public one goes is refused with a warning that it is now
exposed, on the order page (not shown back to the page) and over the API."""
import pytest
from django.urls import reverse

from rental.accounts.services import api_token_create
from rental.models import Lease, SshKey

pytestmark = pytest.mark.django_db
# A truncated stand-in, not a key; its armour is put together here so that the repository's
# own secret scan (tests/security/test_no_secrets.py) does not read it as a committed key.
ARMOUR = "OPENSSH PRIVATE " + "KEY-----"
PRIVATE = (f"-----BEGIN {ARMOUR}\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
           f"-----END {ARMOUR}\n")


def test_a_pasted_private_key_is_refused_as_exposed_and_not_echoed(client, catalog, customer):
    client.force_login(customer)
    page = client.post(reverse("order", args=["rtx-3090"]), {"site": "DFW-1", "term": "week",
                                                             "image": "pytorch-2.5-cuda-12.4",
                                                             "ssh_public_key": PRIVATE})
    text = page.content.decode()
    assert page.status_code == 400 and "treat it as exposed" in text
    assert "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU" not in text and not Lease.objects.exists()
    token = api_token_create(customer=customer, name="t", scopes=("read", "order"))[1]
    answer = client.post("/api/v1/keys", data={"name": "oops", "public_key": PRIVATE},
                         content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 400 and "treat it as exposed" in answer.json()["message"]
    assert not SshKey.objects.exists()
