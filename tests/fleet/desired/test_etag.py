"""An unchanged desired state costs the storefront reads only and the agent a
bodiless `304 Not Modified` (ETag / If-None-Match); any change — the customer's restart, a
suspension — is a new ETag and the full document. Also over real HTTP with the agent's own
client, which keeps the last document and hands it to the loop on a 304."""
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.fleet.conftest import leaseless_agent, node_of

pytestmark = pytest.mark.django_db


def test_same_state_same_etag_and_a_304_without_body(paid_lease, enrol):
    from fleet.services import instance_restart

    lease = paid_lease()
    node = enrol(node_of(lease))
    first = node.desired()
    etag = first["ETag"]
    assert first.status_code == 200 and etag.startswith('"') and first.json()["instances"]
    again = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth)
    assert again.status_code == 304 and again.content == b"" and again["ETag"] == etag
    stale = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH='"not-it"', **node.auth)
    assert stale.status_code == 200 and stale["ETag"] == etag

    from rental.agent import Instance
    from rental.services import lease_provisioned
    assert lease_provisioned(lease_id=lease.pk, instance=Instance(host="203.0.113.7", ssh_port=22042),
                             now=timezone.now())
    instance_restart(lease_id=lease.pk, customer=lease.customer, now=timezone.now())
    changed = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth)
    assert changed.status_code == 200 and changed["ETag"] != etag
    assert changed.json()["instances"][0]["op_id"] != first.json()["instances"][0]["op_id"]


def test_a_steady_poll_takes_no_lock_and_writes_nothing(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert node.desired().status_code == 200          # the first poll issues the op, writes last_seen_at
    with CaptureQueriesContext(connection) as queries:
        assert node.desired().status_code == 200
    statements = [q["sql"].upper() for q in queries.captured_queries]
    writes = [s for s in statements if s.startswith(("INSERT", "UPDATE", "DELETE"))]
    assert writes == []        # the heartbeat is written only once NODE_SEEN_WRITE_SECONDS old
    assert not [s for s in statements if "FOR UPDATE" in s]


def test_a_304_is_decided_from_the_cache_without_a_query(paid_lease, enrol):
    """The node's version in the cache says nothing changed, and this worker knows
    the credential (fleet/credentials.py, under the current credential epoch): no query."""
    lease = paid_lease()
    node = enrol(node_of(lease))
    etag = node.desired()["ETag"]
    with CaptureQueriesContext(connection) as queries:
        again = node.client.get("/agent/v1/desired", HTTP_IF_NONE_MATCH=etag, **node.auth)
    assert again.status_code == 304 and again["ETag"] == etag
    assert queries.captured_queries == []


def test_the_heartbeat_is_written_once_stale(paid_lease, enrol, settings):
    from fleet.models import NodeAgent

    lease = paid_lease()
    node = enrol(node_of(lease))
    node.desired()
    first = NodeAgent.objects.get(node=node.node).last_seen_at
    node.desired()
    assert NodeAgent.objects.get(node=node.node).last_seen_at == first
    settings.NODE_SEEN_WRITE_SECONDS = 0
    node.desired()
    assert NodeAgent.objects.get(node=node.node).last_seen_at > first


@pytest.mark.django_db(transaction=True)
def test_the_agent_client_keeps_its_copy_on_a_304(live_server, paid_lease, operator):
    from fleet.services import enrolment_code_create
    from nodeagent.client import StorefrontClient
    from nodeagent.signing import NodeKey

    lease = paid_lease()
    node = node_of(lease)
    code = enrolment_code_create(node=node, actor=operator, now=timezone.now())
    import tempfile
    from pathlib import Path
    key = NodeKey.generate(Path(tempfile.mkdtemp()) / "key.pem")
    enrolled = StorefrontClient(live_server.url).enrol(code=code, public_key=key.public_key_b64(), hostname="n")
    client = StorefrontClient(live_server.url, credential=enrolled["credential"])
    seen = []
    original = client.session.request

    def spy(method, url, **kwargs):
        response = original(method, url, **kwargs)
        seen.append((kwargs["headers"].get("If-None-Match"), response.status_code))
        return response

    client.session.request = spy
    first = client.desired()
    second = client.desired()
    assert second == first and second["instances"][0]["lease_id"] == lease.pk
    assert seen[0] == (None, 200) and seen[1][1] == 304 and seen[1][0]



@pytest.mark.django_db(transaction=True)
def test_a_steady_agent_round_is_one_signed_report(live_server, catalog, operator, tmp_path):
    """The agent's first round GETs the desired state, every later one is the
    signed report alone, whose answer carries the desired state (null: unchanged): the
    report that waits, which this WSGI server answers at once."""
    agent, node = leaseless_agent(live_server.url, operator, tmp_path)
    calls = []
    original = agent.client.session.request

    def spy(method, url, **kwargs):
        response = original(method, url, **kwargs)
        calls.append((method, url.split("/agent/v1/")[1].split("?")[0], response.status_code))
        return response

    agent.client.session.request = spy
    for _ in range(3):
        started = time.monotonic()
        delay = agent.run_once()
        assert 15 - (time.monotonic() - started) <= delay <= 15     # the rest of the interval: nothing held it
    assert calls == [("GET", "desired", 200), ("POST", "report/watch", 200), ("POST", "report/watch", 200),
                     ("POST", "report/watch", 200)]
    assert agent._held is not None and agent._held["node"] == node.name


def test_the_client_reads_the_desired_state_from_a_report_answer():
    from nodeagent.client import StorefrontClient

    client = StorefrontClient("http://127.0.0.1:9")
    assert client.desired_from({"accepted": [], "refused": []}) is None          # an older storefront
    assert client.desired_from({"desired": None, "desired_etag": '"a"'}) is None  # nothing held yet
    document = {"node": "n", "instances": []}
    assert client.desired_from({"desired": document, "desired_etag": '"a"'}) is document
    assert client.desired_from({"desired": None, "desired_etag": '"a"'}) is document
    assert client.desired_from({"desired": None, "desired_etag": '"b"'}) is None   # not the one held
