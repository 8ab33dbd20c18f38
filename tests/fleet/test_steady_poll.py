"""A steady poll reads the credential from the worker's own memory
(fleet/credentials.py), skips the browser middleware (fleet/middleware.py) and is one
UPDATE and one read of the instance reports (fleet/steady.py). What must not change: a
revoked or replaced credential is refused, a replay changes nothing, a stale cached row
cannot hide a change, and the agent API's answers keep their security headers."""
import json
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import credentials
from fleet.models import NodeAgent
from fleet.services import node_credential_revoke
from rental.models import Lease
from tests.conftest import HAS_REDIS

from .conftest import node_of, ready


def _revoked_by_another_worker(node) -> None:
    """The revocation as this worker sees it when another one made it: the row changed and
    the credential epoch moved, but this process's memory was not cleared."""
    NodeAgent.objects.filter(node=node.node).update(credential_hash=None, revoked_at=timezone.now())
    cache.set(credentials.EPOCH_KEY, "moved-by-another-worker", timeout=None)


def test_a_report_with_a_cached_credential_revoked_elsewhere_is_refused(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    assert node.report().status_code == 200             # this worker now knows the credential
    seq = NodeAgent.objects.get(node=node.node).last_seq
    _revoked_by_another_worker(node)
    response = node.post(node.body())
    assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})
    assert NodeAgent.objects.get(node=node.node).last_seq == seq


def test_a_report_after_a_lost_epoch_bump_is_refused_once_its_heartbeat_is_due(paid_lease, enrol, settings):
    """Neither the epoch moved nor this worker forgot the credential (Redis lost the bump):
    Redis may take a steady report's seq alone (fleet/seq.py) while the cached entry is
    young, but never past NODE_SEEN_WRITE_SECONDS, when the UPDATE re-checks the credential."""
    node = enrol(node_of(paid_lease()))
    assert node.report().status_code == 200
    NodeAgent.objects.filter(node=node.node).update(credential_hash=None, revoked_at=timezone.now())
    settings.NODE_SEEN_WRITE_SECONDS = 0
    response = node.post(node.body())
    assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})


def test_a_reports_cached_credential_outlives_the_cache_lifetime_and_the_heartbeat_rechecks_it(
        paid_lease, enrol, settings):
    """At 10,000 nodes polling every 15 s a worker sees a node every ~30 s, so a
    60 s lifetime made half of all reports look their credential up again. A report does not
    need the lifetime: its seq is taken only under the epoch the entry was loaded under, and
    the heartbeat's UPDATE re-checks the credential (refused here once it is due)."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    item = {"lease_id": lease.pk, "op_id": node.issued_op(lease), "state": "running", "ssh_port": 22042,
            "egress_bytes": 0, "error": None}
    for _ in range(2):                                  # stored, then read and copied
        assert node.post(node.body(instances=[item])).status_code == 200
    settings.NODE_CREDENTIAL_CACHE_SECONDS = 0
    statements = [s.split()[0] for s in _statements(node, node.body(instances=[item]))]
    # With Redis the entry serves and Redis takes the seq: no query at all. Without it the
    # database decides every report, credential lookup first.
    assert statements == ([] if HAS_REDIS else ["SELECT", "UPDATE"])
    NodeAgent.objects.filter(node=node.node).update(credential_hash=None, revoked_at=timezone.now())
    settings.NODE_SEEN_WRITE_SECONDS = 0                # the bump was lost; the heartbeat is due
    response = node.post(node.body(instances=[item]))
    assert (response.status_code, response.json()) == (401, {"error": "unauthorized"})


def test_a_desired_poll_with_a_cached_credential_revoked_elsewhere_is_refused(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    etag = node.desired()["ETag"]
    again = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth)
    assert again.status_code == 304
    _revoked_by_another_worker(node)
    refused = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth)
    assert refused.status_code == 401


def test_a_lost_epoch_bump_is_bounded_by_the_cache_lifetime(paid_lease, enrol, settings):
    node = enrol(node_of(paid_lease()))
    etag = node.desired()["ETag"]
    NodeAgent.objects.filter(node=node.node).update(credential_hash=None, revoked_at=timezone.now())
    # The epoch did not move (say, Redis lost the write): the entry serves while it is young…
    assert node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth).status_code == 304
    settings.NODE_CREDENTIAL_CACHE_SECONDS = 0          # …and not once it is older
    assert node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth).status_code == 401


def test_revoking_through_the_service_refuses_the_next_poll_at_once(paid_lease, enrol, operator):
    node = enrol(node_of(paid_lease()))
    assert node.report().status_code == 200
    node_credential_revoke(node=node.node, actor=operator, now=timezone.now())
    assert node.desired().status_code == 401
    assert node.post(node.body()).status_code == 401


def test_a_replay_with_a_cached_credential_changes_nothing(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    assert node.report().status_code == 200
    body = node.body()
    assert node.post(body).status_code == 200
    stored = NodeAgent.objects.get(node=node.node)
    replayed = node.post(body)
    assert (replayed.status_code, replayed.json()) == (409, {"error": "replayed"})
    assert NodeAgent.objects.get(node=node.node).last_seq == stored.last_seq


def test_a_host_changed_behind_the_cached_row_is_still_followed(paid_lease, enrol):
    """The worker cached the row with the node at 203.0.113.7; another worker stored a
    report from 198.51.100.4 meanwhile. A report from 203.0.113.7 again is a move back, not
    a steady report: the facts are conditions of the steady UPDATE, not compared with the
    cached row."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease, port=22042)])
    assert node.post(node.body()).status_code == 200            # cached here with 203.0.113.7
    cached = dict(credentials._known)
    moved = json.loads(node.body())
    moved["public_host"] = "198.51.100.4"                       # stored by "another worker"…
    assert node.post(json.dumps(moved).encode()).status_code == 200
    assert Lease.objects.get(pk=lease.pk).host == "198.51.100.4"
    credentials._known.update(cached)                           # …so this one still holds 203.0.113.7
    assert node.post(node.body()).status_code == 200            # from 203.0.113.7
    lease.refresh_from_db()
    assert lease.ssh_command == "ssh -p 22042 root@203.0.113.7"
    assert NodeAgent.objects.get(node=node.node).public_host == "203.0.113.7"


def _statements(node, body) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert node.post(body).status_code == 200
    return [" ".join(q["sql"].split()[:3]).upper() for q in queries.captured_queries]


def test_a_steady_report_is_one_update_and_the_heartbeat_is_written_once_stale(paid_lease, enrol, settings):
    lease = paid_lease()
    node = enrol(node_of(lease))

    def instances(state="running"):
        return [{"lease_id": lease.pk, "op_id": node.issued_op(lease), "state": state, "ssh_port": 22042,
                 "egress_bytes": 0, "error": None}]

    assert node.post(node.body(instances=instances())).status_code == 200     # stored
    first = NodeAgent.objects.get(node=node.node)
    # The next one reads the stored instance reports once (and copies them in the cache)…
    first_read = [s.split()[0] for s in _statements(node, node.body(instances=instances()))]
    assert first_read == (["SELECT"] if HAS_REDIS else ["UPDATE", "SELECT"])
    # …after which a steady report is the seq guard alone: in Redis when there is one
    # (fleet/seq.py: no query), else the UPDATE.
    steady = [s.split()[0] for s in _statements(node, node.body(instances=instances()))]
    assert steady == ([] if HAS_REDIS else ["UPDATE"])
    after = NodeAgent.objects.get(node=node.node)
    if not HAS_REDIS:
        assert after.last_seq > first.last_seq and after.last_seen_at > first.last_seen_at
    assert after.last_report_at == first.last_report_at         # younger than NODE_SEEN_WRITE_SECONDS
    NodeAgent.objects.filter(pk=after.pk).update(last_report_at=timezone.now() - timedelta(
        seconds=settings.NODE_SEEN_WRITE_SECONDS + 1))
    settings.NODE_SEEN_WRITE_SECONDS = 0                 # the heartbeat is due (Redis's clock of it, too)
    assert [s.split()[0] for s in _statements(node, node.body(instances=instances()))] == ["UPDATE"]
    written = NodeAgent.objects.get(pk=after.pk)
    assert written.last_report_at > after.last_report_at and written.last_seq > first.last_seq


@pytest.mark.django_db(transaction=True)     # the copy is put once the writes are committed
def test_the_cached_copy_of_the_instance_reports_follows_every_write(paid_lease, enrol):
    from fleet.models import InstanceReport

    lease = paid_lease()
    node = enrol(node_of(lease))
    item = {"lease_id": lease.pk, "op_id": node.issued_op(lease), "state": "running", "ssh_port": 22042,
            "egress_bytes": 0, "error": None}
    for _ in range(3):                                          # stored, then read and copied, then steady
        assert node.post(node.body(instances=[item])).status_code == 200
    stopped = {**item, "state": "stopped"}
    assert any("INSTANCEREPORT" in s for s in _statements(node, node.body(instances=[stopped])))
    assert InstanceReport.objects.get(lease=lease).state == "stopped"
    # The write put its values in the copy: "stopped" is now steady, read from no table, and
    # "running" a change again.
    with CaptureQueriesContext(connection) as queries:
        assert node.post(node.body(instances=[stopped])).status_code == 200
    assert not [q["sql"] for q in queries.captured_queries if "fleet_instancereport" in q["sql"]]
    assert node.post(node.body(instances=[item])).status_code == 200
    assert InstanceReport.objects.get(lease=lease).state == "running"


@pytest.mark.django_db(transaction=True)
def test_a_copy_read_before_a_write_never_replaces_the_one_the_write_put(paid_lease, enrol, monkeypatch):
    """A report that read the table before another's write committed adds its copy only
    where there is none (fleet/steady.py): the written values stay the copy."""
    from fleet import steady

    lease = paid_lease()
    node = enrol(node_of(lease))
    item = {"lease_id": lease.pk, "op_id": node.issued_op(lease), "state": "running", "ssh_port": 22042,
            "egress_bytes": 0, "error": None}
    assert node.post(node.body(instances=[item])).status_code == 200
    assert node.post(node.body(instances=[{**item, "state": "stopped"}])).status_code == 200
    written = cache.get(steady.reports_key(node.node.pk))
    assert written[lease.pk].state == "stopped"
    read_before = {lease.pk: written[lease.pk]._replace(state="running")}
    monkeypatch.setattr(steady, "_read_reports", lambda node_id, ids: read_before)
    assert steady.stored_reports(node.node.pk, [lease.pk], {}) == read_before   # what that report saw
    assert cache.get(steady.reports_key(node.node.pk)) == written


def test_the_agent_api_keeps_its_security_headers_without_the_browser_middleware(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    for response in (node.desired(), node.post(node.body())):
        assert response["Cache-Control"] == "no-store"
        assert response["X-Frame-Options"] == "DENY"
        assert response["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'self'" in response["Content-Security-Policy"]
        assert response["Permissions-Policy"].startswith("accelerometer=()")
        assert "Set-Cookie" not in response and "Vary" not in response     # no session, no locale
