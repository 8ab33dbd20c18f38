"""A report's replay guard (its seq) in Redis, fenced by the database.

A steady report used to be accepted by one UPDATE of the agent's row (the seq, the
heartbeat): at 10,000 nodes, 667 commits a second. Now Redis keeps the highest accepted seq
of each credential and takes a steady report's seq atomically (a Lua script); the database
is written once per NODE_SEEN_WRITE_SECONDS (the heartbeat), when a report's facts differ
from those last written, and when the seq reaches the fence.

Replay protection must survive Redis losing what it held (a restart without persistence, an
eviction, a snapshot restored from disk, a replica promoted). So:

- the database keeps `seq_fence`: Redis never takes a seq above it, and every write of the
  agent's row moves it to seq + NODE_SEQ_FENCE;
- a Redis entry serves only under the run id of the Redis process that wrote it (a restored
  or promoted Redis has another), else it is unknown;
- with no usable entry, the database accepts only a seq above the fence. The agent, refused
  with 409 `replayed`, skips REPLAY_SKIP (≥ NODE_SEQ_FENCE, nodeagent/agent.py) and its next
  report passes: one refused report per node per Redis loss.

Redis records a seq before the database is written (a `VOUCHED` verdict), so a checkpoint
lost after the database write cannot leave Redis below a seq the database accepted.
Without Redis (the embedded default, or an outage) every report is decided by the
database as before, with a fence equal to the seq.
"""
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from django.conf import settings
from django.core.cache import cache

from .models import NodeAgent

#: Lua numbers are doubles: above 2**53 the script could not compare seqs exactly.
_EXACT_BELOW = 2**53
#: A bound every stored fence is below (the column is a signed 64-bit integer).
_ANY_FENCE = 2**63 - 1

_TAKE_FUNCTION = """
local function run_id()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
end
local function take(key, seq_text, now, heartbeat_seconds, facts, run)
  local h = redis.call('HMGET', key, 'seq', 'top', 'seen', 'facts', 'run')
  if not h[1] or h[5] ~= run then return -2 end
  local seq = tonumber(seq_text)
  if seq <= tonumber(h[1]) then return 0 end
  redis.call('HSET', key, 'seq', seq_text)
  if seq > tonumber(h[2]) or tonumber(now) - tonumber(h[3]) >= tonumber(heartbeat_seconds) or h[4] ~= facts then
    return -1
  end
  return 1
end
"""

_TAKE = _TAKE_FUNCTION + "return take(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], run_id())"

#: A known agent's report in one round trip: counted against its rate limit (the throttle's
#: fixed window: INCR, then EXPIRE NX), the poll's keys read (the first: the credential
#: epoch), and its seq taken only when the call is within the limit and the epoch is still
#: the one the worker's cached credential was loaded under (else the view looks it up).
#: Also the run id of this Redis process, which a stored desired-state ETag must have been
#: written under (fleet/desired_version.py: a restored or promoted Redis holds old versions).
#: KEYS: counter, seq key, the keys to read; ARGV: window, limit, epoch as stored, then take's.
_POLL = _TAKE_FUNCTION + """
local count = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1], 'NX')
local values = redis.call('MGET', unpack(KEYS, 3))
local verdict = false
local run = run_id()
if count <= tonumber(ARGV[2]) and values[1] == ARGV[3] then
  verdict = take(KEYS[2], ARGV[4], ARGV[5], ARGV[6], ARGV[7], run)
end
return {count, verdict, values, run}
"""

_CHECKPOINT = """
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local h = redis.call('HMGET', KEYS[1], 'seq', 'run')
local seq = ARGV[1]
if h[1] and h[2] == run and tonumber(h[1]) > tonumber(seq) then seq = h[1] end
redis.call('HSET', KEYS[1], 'seq', seq, 'top', ARGV[2], 'seen', ARGV[3], 'facts', ARGV[4], 'run', run)
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class Verdict(Enum):
    TAKEN = 1        # Redis took the seq: nothing to write for it
    REPLAYED = 0     # not above the highest accepted seq: refuse
    VOUCHED = -1     # above every accepted seq (Redis recorded it); the database must be written
    UNKNOWN = -2     # Redis holds nothing usable: the database accepts only a seq above the fence
    NO_REDIS = None  # no Redis at all: the database alone decides, as before


def _key(agent: NodeAgent) -> str:
    # The credential in the name: a re-enrolment (new credential, seq from 0) starts afresh.
    return f"fleet:seq:{agent.pk}:{agent.credential_hash[:16]}"


def _facts(facts: dict) -> str:
    return "\x1f".join(f"{name}={facts[name]}" for name in sorted(facts) if name != "gpus")


def _take_args(seq: int, facts: dict, now: datetime) -> tuple:
    return seq, int(now.timestamp()), settings.NODE_SEEN_WRITE_SECONDS, _facts(facts)


def seq_take(agent: NodeAgent, seq: int, facts: dict, now: datetime) -> Verdict:
    """Redis's verdict on a report's seq, with the facts it carries (agent version, host,
    GPU library): a report whose facts differ from the last written ones is VOUCHED at
    best, so the database is written."""
    if not hasattr(cache, "run_script"):
        return Verdict.NO_REDIS
    if seq >= _EXACT_BELOW:
        return Verdict.UNKNOWN
    answer = cache.run_script(_TAKE, keys=(_key(agent),), args=_take_args(seq, facts, now))
    return Verdict.NO_REDIS if answer is None else Verdict(answer)


@dataclass
class Polled:
    count: int                  # the call's number in its rate-limit window
    found: dict                 # the keys read, as cache.get_many finds them
    verdict: Verdict | None     # None: not taken (over the limit, or the epoch moved)
    run: str                    # the run id of the Redis process that answered


def seq_take_polled(agent: NodeAgent, seq: int, facts: dict, now: datetime, *, counter: str, limit: int,
                    window_seconds: int, read: tuple, epoch: str) -> Polled | None:
    """seq_take with the poll's rate-limit count and key reads (`read[0]`: the credential
    epoch, which must still be `epoch`), in one round trip. None: no Redis, or a
    seq the script cannot compare (the caller takes the usual path)."""
    if not hasattr(cache, "run_script") or seq >= _EXACT_BELOW:
        return None
    answer = cache.run_script(_POLL, keys=(counter, _key(agent), *read),
                              args=(window_seconds, limit, cache.encoded(epoch), *_take_args(seq, facts, now)))
    if answer is None:
        return None
    count, verdict, values, run = answer
    found = {k: cache.decoded(v) for k, v in zip(read, values, strict=True) if v is not None}
    return Polled(count, found, None if verdict is None else Verdict(verdict),
                  run.decode() if isinstance(run, bytes) else run)


def fence_after(verdict: Verdict, seq: int) -> int:
    """The seq_fence to store with an accepted seq: NODE_SEQ_FENCE above it when Redis is
    there to take the next ones, the seq itself when it is not."""
    return seq if verdict is Verdict.NO_REDIS else seq + settings.NODE_SEQ_FENCE


def fence_bound(verdict: Verdict, seq: int) -> int:
    """The database accepts `seq` only when its seq_fence is below this: Redis vouches that
    the seq is above every accepted one (any fence), or the fence must be below the seq."""
    return _ANY_FENCE if verdict in (Verdict.TAKEN, Verdict.VOUCHED) else seq


def seq_checkpointed(agent: NodeAgent, seq: int, facts: dict, now: datetime, verdict: Verdict) -> None:
    """The database accepted `seq` with fence_after(verdict, seq): Redis may take the seqs
    up to that fence, and holds the facts just written, until the next heartbeat is due."""
    if verdict is Verdict.NO_REDIS or seq >= _EXACT_BELOW:
        return
    cache.run_script(_CHECKPOINT, keys=(_key(agent),),
                     args=(seq, fence_after(verdict, seq), int(now.timestamp()), _facts(facts),
                           settings.NODE_SEQ_KEY_SECONDS))


def seq_forgotten(agent: NodeAgent) -> None:
    """Tests and tools: Redis loses the agent's entry (what a restart without persistence does)."""
    cache.delete(_key(agent))

