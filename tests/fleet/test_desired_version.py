"""A steady desired poll is answered 304 from the node's version in the cache, so
every change to what a node must do has to move that version. The ORM hooks
(fleet/desired_version.py) do it for every watched model; these tests prove that the
document reads no table that is not watched, and walk the services that change a node's
desired state: after each, the ETag held is no longer answered 304 from the cache."""
import re
from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.conftest import HAS_REDIS

from .conftest import disk_wiped, key_destroyed, node_of

pytestmark = pytest.mark.django_db


def _tables_read(sqls: list[str]) -> set[str]:
    return {t for sql in sqls for t in re.findall(r'(?:FROM|JOIN) "(\w+)"', sql)}


def test_the_document_reads_only_watched_tables(paid_lease, enrol):
    from fleet.desired import desired_document
    from fleet.desired_version import DERIVED, WATCHED

    lease = paid_lease()
    node = node_of(lease)
    enrol(node)
    with CaptureQueriesContext(connection) as queries:
        desired_document(node=node, now=timezone.now())
    by_table = {m._meta.db_table: m._meta.label for m in apps.get_models()}
    read = {by_table[t] for t in _tables_read([q["sql"] for q in queries.captured_queries])}
    assert "rental.Lease" in read and "inventory.SlotAllocation" in read        # it did read the inputs
    assert read - set(WATCHED) - DERIVED == set(), "watch these in fleet/desired_version.py WATCHED"


def _held(node_agent):
    """The node polls and holds the ETag; the cache says it is current."""
    from fleet.desired_version import current_etag

    etag = node_agent.desired()["ETag"]
    assert current_etag(node_agent.node.pk, timezone.now()) == etag
    return etag


def _moved(node_agent, etag) -> bool:
    from fleet.desired_version import current_etag

    return current_etag(node_agent.node.pk, timezone.now()) != etag


def accepted(response) -> None:
    assert response.status_code == 200 and response.json()["accepted"] == ["evidence[0]"], response.json()


def test_every_service_that_changes_a_node_moves_its_version(paid_lease, enrol, operator):
    from fleet.services import instance_restart, instance_start, instance_stop
    from inventory.burnin import burn_in_request
    from inventory.models import BurnIn, GpuSlot
    from rental.agent import Instance
    from rental.models import Lease
    from rental.services import (
        lease_provisioned,
        lease_release,
        lease_resume,
        lease_suspend,
    )

    lease = paid_lease()
    other = paid_lease()
    node = node_of(lease)
    agent = enrol(node)
    now = timezone.now()

    def after_term():
        return Lease.objects.get(pk=lease.pk).ends_at + timedelta(days=1)

    steps = [
        ("provisioned", lambda: lease_provisioned(lease_id=lease.pk, instance=Instance(host="203.0.113.7",
                                                                                        ssh_port=22042), now=now)),
        ("restart", lambda: instance_restart(lease_id=lease.pk, customer=lease.customer, now=now)),
        ("stop", lambda: instance_stop(lease_id=lease.pk, customer=lease.customer, now=now)),
        ("start", lambda: instance_start(lease_id=lease.pk, customer=lease.customer, now=now)),
        ("suspend", lambda: lease_suspend(lease_id=lease.pk, now=now, force=True)),
        ("resume", lambda: lease_resume(lease_id=lease.pk, now=now, actor=operator, reason="test")),
        ("burn-in", lambda: burn_in_request(slot=GpuSlot.objects.filter(node=node).order_by("-index").first(), reason=BurnIn.Reason.OPERATOR,
            now=now, actor=operator)),
        ("suspend again", lambda: lease_suspend(lease_id=lease.pk, now=now, force=True)),
        # released after its term: the slots go and the disk key's destruction is requested
        ("release", lambda: lease_release(lease_id=lease.pk, now=after_term(), force=True)),
        # the node's signed evidence: the key destroyed (the wipe is asked next), the disk wiped
        ("key destroyed", lambda: accepted(agent.post(agent.body(evidence=[key_destroyed(agent, lease)])))),
        ("disk wiped", lambda: accepted(agent.post(agent.body(evidence=[disk_wiped(agent, lease)])))),
    ]
    for name, change in steps:
        etag = _held(agent)
        change()
        assert _moved(agent, etag), f"{name} did not move the node's desired-state version"
    # A change to another node's lease leaves this node's version alone.
    if node_of(other).pk != node.pk:
        etag = _held(agent)
        instance_stop(lease_id=other.pk, customer=other.customer, now=now) if other.state == "active" else \
            lease_suspend(lease_id=other.pk, now=now, force=True)
        assert not _moved(agent, etag)


def test_a_queryset_update_and_a_bulk_create_move_the_version(paid_lease, enrol):
    from fleet.models import InstanceIntent
    from rental.models import Lease

    lease = paid_lease()
    agent = enrol(node_of(lease))
    etag = _held(agent)
    Lease.objects.filter(pk=lease.pk).update(ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB other")
    assert _moved(agent, etag)
    refreshed = agent.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **agent.auth)
    assert refreshed.status_code == 200 and refreshed.json()["instances"][0]["ssh_authorized_keys"] == [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB other"]
    etag = _held(agent)
    InstanceIntent.objects.bulk_create([InstanceIntent(lease=lease, stopped_by_customer=True,
                                                       changed_at=timezone.now())])
    assert _moved(agent, etag)


def test_a_validator_is_recomputed_once_too_old(paid_lease, enrol, settings):
    from fleet.desired_version import current_etag

    lease = paid_lease()
    agent = enrol(node_of(lease))
    etag = _held(agent)
    settings.NODE_DESIRED_REVALIDATE_SECONDS = -1
    assert current_etag(agent.node.pk, timezone.now()) is None
    again = agent.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **agent.auth)
    assert again.status_code == 304          # recomputed: the same content, still a 304


def test_a_validator_lasts_until_the_clock_changes_the_document(paid_lease, enrol):
    """A snapshot attempt that is not due yet (SNAPSHOT_RETRY_SECONDS) is the one part of the
    document that changes by time alone: the ETag is answered from the cache until that moment
    and not after, without waiting for the revalidation interval."""
    from fleet.desired_version import current_etag
    from rental.models import Snapshot

    lease = paid_lease()
    agent = enrol(node_of(lease))
    now = timezone.now()
    due = now + timedelta(seconds=60)
    Snapshot.objects.create(customer=lease.customer, source_lease=lease, region=lease.site.region, site=lease.site,
                            size_tb=1, state=Snapshot.State.CREATING, created_at=now, paid_until=now + timedelta(days=7),
                            repository="s3:rgw.example/snapshots", attempt_started_at=due)
    etag = _held(agent)
    assert "snapshot" not in agent.desired().json()["instances"][0]      # not due yet
    assert current_etag(agent.node.pk, due - timedelta(seconds=1)) == etag
    assert current_etag(agent.node.pk, due) is None


def test_an_etag_stored_under_another_redis_run_is_computed_again(paid_lease, enrol):
    """A Redis restored from disk or a promoted replica may hold a version older than a change
    made since: an ETag written under another Redis run id is not answered from the cache. A
    poll whose round trip did not say which Redis answered (an older agent's GET) is decided by
    the version alone."""
    from django.core.cache import cache

    from fleet.desired_version import (
        REDIS_RUN,
        current_etag,
        desired_stamp,
        etag_keys,
        remember_etag,
    )

    lease = paid_lease()
    agent = enrol(node_of(lease))
    node_id, now = agent.node.pk, timezone.now()
    remember_etag(node_id, desired_stamp(node_id), '"held"', now, run="run-before")
    found = cache.get_many(etag_keys(node_id))
    assert current_etag(node_id, now, found={**found, REDIS_RUN: "run-before"}) == '"held"'
    assert current_etag(node_id, now, found={**found, REDIS_RUN: "run-after"}) is None
    assert current_etag(node_id, now, found=found) == '"held"'
    if HAS_REDIS:        # the report's one round trip (fleet/seq.py) says which Redis answered
        assert agent.report().status_code == 200
        run = cache._cache.get_client().info("server")["run_id"]
        answer = agent.post(agent.body(desired_etag='"held"')).json()
        assert answer["desired"] is not None                 # computed again under this run…
        assert cache.get(etag_keys(node_id)[-1])[-1] == run  # …and stored under it
        assert agent.post(agent.body(desired_etag=answer["desired_etag"])).json()["desired"] is None


def test_a_report_is_answered_with_the_desired_state(paid_lease, enrol):
    """One request per steady poll: the report says which ETag it holds; the answer says
    null while it is current and carries the new document once something changed."""
    from fleet.services import instance_restart
    from rental.agent import Instance
    from rental.services import lease_provisioned

    lease = paid_lease()
    agent = enrol(node_of(lease))
    lease_provisioned(lease_id=lease.pk, instance=Instance(host="203.0.113.7", ssh_port=22042), now=timezone.now())
    first = agent.post(agent.body(desired_etag=""))
    assert first.status_code == 200
    document, etag = first.json()["desired"], first.json()["desired_etag"]
    assert document["instances"][0]["lease_id"] == lease.pk and etag.startswith('"')
    steady = agent.post(agent.body(desired_etag=etag)).json()
    assert steady["desired"] is None and steady["desired_etag"] == etag
    assert "desired" not in agent.post(agent.body()).json()        # an agent that polls GET itself gets what it had
    instance_restart(lease_id=lease.pk, customer=lease.customer, now=timezone.now())
    changed = agent.post(agent.body(desired_etag=etag)).json()
    assert changed["desired_etag"] != etag
    assert changed["desired"]["instances"][0]["op_id"] != document["instances"][0]["op_id"]
