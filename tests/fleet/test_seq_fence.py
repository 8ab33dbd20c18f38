"""Issue 31: a steady report's seq is taken by Redis (fleet/seq.py), fenced by the database.
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
