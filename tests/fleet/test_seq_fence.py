"""A steady report's seq is taken by Redis (fleet/seq.py), fenced by the database.
What must hold: a replay is refused whether Redis or the database decides, and after Redis
loses what it held — a restart without persistence, or a snapshot restored from disk — no
seq it had accepted passes again; the agent is refused once, skips, and goes on."""
import pytest
from django.core.cache import cache

from fleet.models import NodeAgent
from fleet.seq import _key, seq_forgotten

from .conftest import node_of

pytestmark = pytest.mark.redis


def _steady(node, count: int) -> list[bytes]:
    bodies = [node.body() for _ in range(count)]
    for body in bodies:
        assert node.post(body).status_code == 200
    return bodies


def test_redis_takes_steady_seqs_and_refuses_their_replay(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    bodies = _steady(node, 4)
    stored = NodeAgent.objects.get(node=node.node)
    assert stored.last_seq < 4 and stored.seq_fence == stored.last_seq + 1000   # Redis took the later ones
    for body in bodies:
        replay = node.post(body)
        assert (replay.status_code, replay.json()) == (409, {"error": "replayed"})


@pytest.mark.parametrize("loss", ["restart", "restored snapshot"])
def test_after_redis_lost_its_entry_no_accepted_seq_passes_again(paid_lease, enrol, settings, loss):
    node = enrol(node_of(paid_lease()))
    bodies = _steady(node, 4)
    agent = NodeAgent.objects.get(node=node.node)
    if loss == "restart":
        seq_forgotten(agent)
    else:   # the entry is back as it was, but written by another Redis process
        client = cache._cache.get_client(write=True)
        client.hset(cache.make_and_validate_key(_key(agent)), "run", "0" * 40)
        client.hset(cache.make_and_validate_key(_key(agent)), "seq", 1)
    for body in bodies:
        assert node.post(body).status_code == 409
    # The agent's next seq is below the fence too: refused; past it (the agent's skip), taken.
    assert node.post(node.body(seq=5)).status_code == 409
    assert node.post(node.body(seq=4 + settings.NODE_SEQ_FENCE + 1)).status_code == 200
    assert node.post(node.body(seq=4 + settings.NODE_SEQ_FENCE + 2)).status_code == 200
    assert node.post(node.body(seq=4 + settings.NODE_SEQ_FENCE + 2)).status_code == 409


def test_the_fence_is_within_the_agents_skip(settings):
    from nodeagent.agent import REPLAY_SKIP
    assert settings.NODE_SEQ_FENCE <= REPLAY_SKIP


def test_a_changed_fact_is_written_at_once(paid_lease, enrol):
    import json
    node = enrol(node_of(paid_lease()))
    _steady(node, 3)
    moved = json.loads(node.body())
    moved["agent_version"] = "0.2.0"
    assert node.post(json.dumps(moved).encode()).status_code == 200
    assert NodeAgent.objects.get(node=node.node).agent_version == "0.2.0"


# --- the report of a known agent is one Redis round trip (session 9) ----------------------

class _RoundTrips:
    """Counts what this process sends Redis: a pipeline or a script is one send."""

    def __init__(self, monkeypatch):
        from redis.connection import AbstractConnection
        self.count, send = 0, AbstractConnection.send_packed_command

        def counted(connection, command, check_health=True):
            self.count += 1
            return send(connection, command, check_health)
        monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)


def _counter_key(node) -> str:
    from rental.accounts.throttle import throttle_counter
    return throttle_counter("node-requests", None, key=f"node:{NodeAgent.objects.get(node=node.node).pk}")


def _counter(node) -> int:
    return cache.get(_counter_key(node)) or 0


def test_a_steady_report_of_a_known_agent_is_one_round_trip_and_no_query(paid_lease, enrol, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    node = enrol(node_of(paid_lease()))
    _steady(node, 3)                                 # stored, the instance reports copied, steady
    body, sent = node.body(), _RoundTrips(monkeypatch)
    with CaptureQueriesContext(connection) as queries:
        answer = node.post(body)
    assert answer.status_code == 200
    assert (sent.count, len(queries)) == (1, 0)
    assert node.post(body).status_code == 409        # and its seq was taken in that one trip


def test_a_report_over_the_rate_limit_is_refused_without_taking_its_seq(paid_lease, enrol, settings):
    settings.NODE_POLL_SECONDS, settings.NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE = 240, 5   # a limit of 5
    node = enrol(node_of(paid_lease()))
    _steady(node, 5 - _counter(node))
    body = node.body()
    refused = node.post(body)
    assert (refused.status_code, refused["Retry-After"]) == (429, "60")
    cache.delete(_counter_key(node))                 # the next window
    assert node.post(body).status_code == 200        # its seq was still free
    assert node.post(body).status_code == 409


def test_a_report_after_the_credential_epoch_moved_is_looked_up_and_counted_once(paid_lease, enrol):
    from fleet import credentials

    node = enrol(node_of(paid_lease()))
    _steady(node, 2)                                 # this worker caches the credential
    cache.set(credentials.EPOCH_KEY, "moved-by-an-enrolment-elsewhere", timeout=None)
    before = _counter(node)
    body = node.body()
    assert node.post(body).status_code == 200        # the credential is still good: looked up, accepted
    assert _counter(node) == before + 1
    assert node.post(body).status_code == 409


def test_a_bad_signature_from_a_known_agent_is_refused_and_counted(paid_lease, enrol):
    node = enrol(node_of(paid_lease()))
    _steady(node, 2)
    before, body = _counter(node), node.body()
    forged = node.post(body, signature="A" * 88)
    assert (forged.status_code, forged.json()) == (401, {"error": "bad_signature"})
    assert _counter(node) == before + 1
    assert node.post(body).status_code == 200        # the forgery took nothing of the real report's
