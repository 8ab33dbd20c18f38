"""Which node a lease is on, as the node agents' reports are judged by it (fleet/desired.py:
current_node_id, instance_of): a node's instance_ready counts for the leases it holds now,
whichever other leases other nodes hold, and the customer connects to the host the node
reported — or, from a node that reported none, to the host its instance reported. And what
answering a node costs (desired_answer and _leases_on): the ETag is remembered
under the Redis run that answered, and the document's reads do not grow with its leases."""
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.sealing import seal
from fleet.desired import desired_answer, desired_document
from fleet.desired_version import REDIS_RUN, current_etag, etag_keys
from rental.models import LeaseState, Snapshot
from rental.storage import lease_restore_from_set, lease_restored
from tests.fleet.conftest import node_of, provision_then_release, ready

pytestmark = pytest.mark.django_db


def ready_at(node, lease, host, port):
    """instance_ready as the agent reports it, the instance answering at `host`."""
    return node.evidence("instance_ready", lease, ssh_port=port, host=host, gpus=["GPU-0"], image="pytorch")


def test_an_instance_ready_counts_for_the_lease_on_its_own_node_whatever_other_nodes_hold(paid_lease, enrol):
    """Two leases on two nodes: each node's instance_ready provisions its own lease; the other
    node's allocation is not where this lease is."""
    first, second = paid_lease(), paid_lease(offer="2x-a100-sxm")
    assert node_of(first) != node_of(second)
    one, two = enrol(node_of(first)), enrol(node_of(second))
    assert two.report(evidence=[ready(two, second, port=23005)]).json()["accepted"] == ["evidence[0]"]
    assert one.report(evidence=[ready(one, first, port=22042)]).json()["accepted"] == ["evidence[0]"]
    first.refresh_from_db()
    second.refresh_from_db()
    assert (second.state, second.ssh_port) == (LeaseState.ACTIVE, 23005)
    assert (first.state, first.ssh_port) == (LeaseState.ACTIVE, 22042)


def test_a_node_that_reported_no_public_host_gives_customers_the_host_its_instance_reported(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    body = node.body(public_host=None, evidence=[ready_at(node, lease, "198.51.100.9", 22042)])
    assert node.post(body).json()["accepted"] == ["evidence[0]"]
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    assert lease.ssh_command == "ssh -p 22042 root@198.51.100.9"


def test_the_node_s_public_host_wins_over_the_host_its_instance_reported(paid_lease, enrol):
    """The customer connects to the node's public host (PROTOCOL.md) at the port the node
    reported; the instance's own idea of its address is only the fallback."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert node.report(evidence=[ready_at(node, lease, "198.51.100.9", 22042)]).json()["accepted"] == ["evidence[0]"]
    lease.refresh_from_db()
    assert lease.ssh_command == "ssh -p 22042 root@203.0.113.7"


def test_an_etag_answered_through_a_redis_run_is_current_for_the_next_poll_through_it(paid_lease, enrol):
    """The ETag a report's answer computes is remembered under the run id of the
    Redis that answered the report's round trip, so the next steady report through the same
    Redis is answered from the cache (and one through another Redis is computed again)."""
    lease = paid_lease()
    node = enrol(node_of(lease)).node
    now = timezone.now()
    _document, etag = desired_answer(node=node, now=now, run="run-a")
    found = cache.get_many(etag_keys(node.pk))
    assert current_etag(node.pk, now, found={**found, REDIS_RUN: "run-a"}) == etag
    assert current_etag(node.pk, now, found={**found, REDIS_RUN: "run-b"}) is None


def test_a_node_s_document_costs_the_same_reads_with_more_leases_on_it(paid_lease, enrol):
    """EXPLAIN at 10,000 nodes: the document's reads do not grow with the leases a
    node lists — running ones (their image and disk size), ones restored from a snapshot, and
    ended ones whose disk key the node is told to destroy."""
    source = paid_lease()
    node = enrol(node_of(source))
    now = timezone.now()
    snap = Snapshot.objects.create(
        customer=source.customer, source_lease=source, region=source.site.region, site=source.site, size_tb=1,
        state=Snapshot.State.AVAILABLE, created_at=now, ready_at=now, paid_until=now + timedelta(days=7),
        repository="s3:https://rgw.example/snap", access_key="AK1", restic_snapshot="4f1c2b9e",
        content_bytes=10**9, sealed_secrets=seal({"secret_key": "s3-secret", "password": "restic-password"}))

    def add_leases():
        restored = paid_lease()
        lease_restore_from_set(lease=restored, snapshot=snap, now=timezone.now())
        assert lease_restored(lease_id=restored.pk, snapshot_id=snap.pk, facts={"bytes": 10**9}, now=timezone.now())
        ended = paid_lease()
        assert node_of(restored) == node_of(ended) == node.node
        provision_then_release(node, ended)

    def reads() -> tuple[int, list]:
        desired_document(node=node.node, now=timezone.now())         # ops issued: the next poll is steady
        with CaptureQueriesContext(connection) as queries:
            items = desired_document(node=node.node, now=timezone.now())["instances"]
        return len(queries.captured_queries), sorted((i["want"], i["disk"]) for i in items)

    add_leases()
    few, listed = reads()
    assert listed == [("absent", "destroy_key"), ("running", "keep"), ("running", "keep")]
    add_leases()
    add_leases()
    many, listed = reads()
    assert listed == [("absent", "destroy_key")] * 3 + [("running", "keep")] * 4
    assert many == few
