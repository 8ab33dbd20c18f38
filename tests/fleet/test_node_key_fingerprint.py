"""The customer is given the node's key fingerprint when the lease starts (lease page, the
`instance.ready` webhook's payload, the API's lease detail), before any record exists; the
sanitization record later checks out against it with the customer's own CLI verifier and
fails against another node's."""
import sys
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from nodeagent.signing import fingerprint
from rental.accounts.services import api_token_create
from rental.models import Lease
from rental.notifications.services import lease_data

from .conftest import node_of, ready

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cli"))
from gpu_rent import verify  # noqa: E402

pytestmark = pytest.mark.django_db


def test_the_fingerprint_is_given_at_lease_start_on_page_webhook_and_api(paid_lease, enrol, customer):
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert lease_data(lease)["node_key_fingerprint"] is None          # nothing before the instance
    assert node.report(evidence=[ready(node, lease)]).json()["accepted"] == ["evidence[0]"]
    given = fingerprint(node.public_key)
    assert given == verify.fingerprint(node.public_key)                # the CLI computes the same
    lease = Lease.objects.get(pk=lease.pk)
    assert lease.node_key_fingerprints() == [given]
    assert lease_data(lease)["node_key_fingerprint"] == given          # instance.ready's payload
    token = api_token_create(customer=customer, name="t", scopes=["read"])[1]
    detail = Client().get(f"/api/v1/leases/{lease.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert detail["node_key_fingerprints"] == [given]
    client = Client()
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert given in page and "gpu-rent verify-record" in page


def test_the_record_checks_out_against_the_fingerprint_given_and_not_another(wiped, enrol, catalog):  # noqa: F811
    lease, node = wiped
    from fleet.records import sanitization_record

    record = sanitization_record(lease, now=timezone.now())
    given = Lease.objects.get(pk=lease.pk).node_key_fingerprints()
    assert given == [fingerprint(node.public_key)]
    results = verify.verify(record, given)
    assert all(r.ok for r in results) and verify.exit_status(results, fingerprints_given=True) == verify.EXIT_OK
    from inventory.models import Node

    other = enrol(Node.objects.exclude(pk=node.node.pk).order_by("name").first())
    against_other = verify.verify(record, [fingerprint(other.public_key)])
    assert verify.exit_status(against_other, fingerprints_given=True) == verify.EXIT_BAD
