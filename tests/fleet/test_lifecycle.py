"""A lease's whole life driven by a node's reports and the lifecycle passes, with the node
agent as HOST_AGENT: paid → the node is told to run it → its signed instance_ready makes
it active → unpaid at term end it is stopped → paid again it runs → released, the node
destroys the key and at once wipes the disk, each only on its proof. Then the agent
API through the real CSRF middleware, and (PostgreSQL) replays racing each other."""
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Invoice
from billing.services import balance_top_up, invoice_pay_from_balance
from fleet.models import NodeAgent
from ops.lifecycle import run_lifecycle
from rental.models import DiskKey, LeaseState
from tests.billing.races import in_threads
from tests.conftest import ON_POSTGRES

from .conftest import FakeNode, disk_wiped, key_destroyed, node_of, provision_then_release, ready

S = LeaseState


def wanted(node, lease):
    item = next(i for i in node.desired().json()["instances"] if i["lease_id"] == lease.pk)
    return item["want"], item["disk"], item["op_id"]


@pytest.mark.django_db
def test_a_lease_from_payment_to_wipe(paid_lease, enrol, customer):
    lease = paid_lease(term="week")
    node = enrol(node_of(lease))
    assert wanted(node, lease)[:2] == ("running", "keep")
    run_lifecycle(timezone.now())
    lease.refresh_from_db()
    assert lease.state == S.PROVISIONING  # no proof yet: the driver says "not yet"
    node.report(evidence=[ready(node, lease, port=22042)])
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE

    # The term ends unpaid: suspended, the node is told to stop (files kept).
    end = lease.ends_at
    run_lifecycle(end + timedelta(minutes=1))
    lease.refresh_from_db()
    assert lease.state == S.SUSPENDED and wanted(node, lease)[:2] == ("stopped", "keep")
    # Paid during the hold: it runs again.
    renewal = Invoice.objects.get(lease=lease, kind="renewal")
    balance_top_up(customer=customer, amount_cents=renewal.amount_cents, now=end + timedelta(hours=1))
    invoice_pay_from_balance(invoice=renewal, now=end + timedelta(hours=1))
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE and wanted(node, lease)[:2] == ("running", "keep")

    # The next term ends unpaid and the hold runs out: released, key destruction asked.
    end = lease.ends_at
    run_lifecycle(end + timedelta(minutes=1))
    run_lifecycle(end + timedelta(hours=72, minutes=1))
    lease.refresh_from_db()
    assert lease.state == S.RELEASED
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROY_REQUESTED
    assert wanted(node, lease)[:2] == ("absent", "destroy_key")
    run_lifecycle(end + timedelta(hours=73))  # the sweep asks again: still no proof, still requested
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROY_REQUESTED
    node.report(evidence=[key_destroyed(node, lease)])
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED

    # The key is gone: the node is asked for the wipe at once, days before the wipe_by
    # deadline (which only alerts watch), and its proof wipes the lease.
    assert lease.wipe_by > timezone.now() + timedelta(days=1)
    assert wanted(node, lease)[:2] == ("absent", "wipe")
    run_lifecycle(timezone.now())
    lease.refresh_from_db()
    assert lease.state == S.RELEASED  # the wipe sweep found no proof: waits
    node.report(evidence=[disk_wiped(node, lease)])
    lease.refresh_from_db()
    assert lease.state == S.WIPED
    kinds = list(lease.events.order_by("id").values_list("kind", flat=True))  # reports use the real clock
    assert kinds == ["created", "paid", "provisioned", "suspended", "extended", "suspended", "released",
                     "key_destroy_requested", "key_destroyed", "wiped"]


@pytest.mark.django_db
def test_agent_api_needs_no_csrf_token(paid_lease, enrol, operator):
    from fleet.services import enrolment_code_create

    lease = paid_lease()
    node = FakeNode(node_of(lease), Client(enforce_csrf_checks=True))
    assert node.enrol(enrolment_code_create(node=node.node, actor=operator, now=timezone.now())).status_code == 200
    assert node.report(evidence=[ready(node, lease)]).json()["accepted"] == ["evidence[0]"]


postgres_only = pytest.mark.skipif(not ON_POSTGRES, reason="row-lock races need DATABASE_URL=postgres://…")


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_same_report_sent_eight_times_at_once_is_accepted_once(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.desired()
    body = node.body(evidence=[ready(node, lease)])
    signature = node.sign(body)

    def send():
        return node.post(body, signature=signature).status_code

    codes = in_threads(*[send] * 8)
    assert sorted(codes) == [200] + [409] * 7, codes
    assert NodeAgent.objects.get(node=node.node).last_seq == json.loads(body)["seq"]
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE and lease.events.filter(kind="provisioned").count() == 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_key_proof_racing_the_sweep_destroys_once(paid_lease, enrol):

    lease = paid_lease()
    node = enrol(node_of(lease))
    provision_then_release(node, lease)
    node.desired()
    record = key_destroyed(node, lease)
    results = in_threads(lambda: node.post(node.body(evidence=[record])).json(),
                         lambda: run_lifecycle(timezone.now()))
    assert not any(isinstance(r, BaseException) for r in results), results
    run_lifecycle(timezone.now())
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED
    assert lease.events.filter(kind="key_destroyed").count() == 1
