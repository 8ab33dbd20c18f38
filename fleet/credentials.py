"""Which agent a request's credential names, without a query on every poll.

Each worker keeps the agents it has seen by credential hash (only credentials that matched
an enrolled, unrevoked agent; at most NODE_CREDENTIAL_CACHE_MAX of them). The cached row is
never the last word:

- a **report** writing the agent's row does so by one UPDATE that checks the credential, the
  public key the signature was verified with and that the agent is not revoked, together
  with the seq (fleet/reports.py); a steady report whose seq Redis takes alone (fleet/seq.py)
  writes nothing, so it trusts the entry as a desired poll does, and the row is written
  (and the credential re-checked) at least every NODE_SEEN_WRITE_SECONDS;
- a **desired-state poll** trusts an entry only under the credential epoch it was loaded
  under, a cache key every enrolment and revocation moves (`credentials_changed`, called by
  the services and by the ORM signals of NodeAgent); it is read in the same round trip as
  the desired-state version, and only for NODE_CREDENTIAL_CACHE_SECONDS. Without the cache
  every poll looks the credential up; a bump lost to a Redis restart is bounded by that
  lifetime for desired polls and by the heartbeat for reports.
"""
import secrets
import time

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import signals

from .crypto import secret_hash
from .models import NodeAgent

EPOCH_KEY = "fleet:credentials:epoch"

#: credential hash -> (monotonic time loaded, credential epoch then, the row's values)
_known: dict[str, tuple[float, str | None, tuple]] = {}
_FIELDS = [f.attname for f in NodeAgent._meta.concrete_fields]
_ID, _NODE_ID = _FIELDS.index("id"), _FIELDS.index("node_id")


def _instance(values: tuple) -> NodeAgent:
    return NodeAgent.from_db("default", _FIELDS, values)


def _load(credential_hash: str, epoch: str | None) -> NodeAgent | None:
    row = (NodeAgent.objects.filter(credential_hash=credential_hash, revoked_at__isnull=True)
           .values_list(*_FIELDS).first())
    if row is None:
        _known.pop(credential_hash, None)
        return None
    if len(_known) >= settings.NODE_CREDENTIAL_CACHE_MAX:
        _known.clear()                     # a bound, not an LRU: refills one query per node
    _known[credential_hash] = (time.monotonic(), epoch, row)
    return _instance(row)


def credential_hash_of(credential: str) -> str | None:
    credential = credential.strip()
    if not credential or len(credential) > 200:
        return None
    return secret_hash(credential)


def cached_agent(credential_hash: str, *, epoch: str | None = None, checked_by_caller: bool = False
                 ) -> NodeAgent | None:
    """The enrolled, unrevoked agent of this credential, or None. An entry younger than
    NODE_CREDENTIAL_CACHE_SECONDS serves when the caller re-checks the credential itself
    (`checked_by_caller`: the report's UPDATE) or when it was loaded under `epoch`, the
    current credential epoch; anything else is looked up."""
    entry = _known.get(credential_hash)
    if entry is not None and time.monotonic() - entry[0] < settings.NODE_CREDENTIAL_CACHE_SECONDS \
            and (checked_by_caller or (epoch is not None and entry[1] == epoch)):
        return _instance(entry[2])
    return _load(credential_hash, epoch)


def cached_unchecked(credential_hash: str) -> tuple[NodeAgent, str | None] | None:
    """The cached entry's agent and the credential epoch it was loaded under, whatever the
    current epoch and whatever its age: a report checks its signature with it, then serves
    from it only if that epoch is still current (fleet/seq.py's one round trip), and the
    database re-checks the credential whenever the heartbeat is due (the seq script sends
    the report to the UPDATE every NODE_SEEN_WRITE_SECONDS). An age limit here would add
    nothing to that and cost a lookup per node per worker per NODE_CREDENTIAL_CACHE_SECONDS:
    at 10,000 nodes polling every 15 s, half of all reports."""
    entry = _known.get(credential_hash)
    return None if entry is None else (_instance(entry[2]), entry[1])


def cached_ids(credential_hash: str) -> tuple[int, int] | None:
    """(agent id, node id) of the cached entry, unchecked: which keys to read in the round
    trip that then tells whether the entry serves."""
    entry = _known.get(credential_hash)
    return (entry[2][_ID], entry[2][_NODE_ID]) if entry else None


def remember(agent: NodeAgent) -> None:
    """The agent's row as this request left it (a report's facts), kept for the next one."""
    entry = _known.get(agent.credential_hash or "")
    if entry is not None:
        _known[agent.credential_hash] = (entry[0], entry[1], tuple(getattr(agent, f) for f in _FIELDS))


def forget(credential_hash: str | None) -> None:
    _known.pop(credential_hash or "", None)


def current_epoch(found: dict) -> str | None:
    """The credential epoch among keys read with `cache.get_many` (created when missing)."""
    epoch = found.get(EPOCH_KEY)
    if epoch is None:
        cache.add(EPOCH_KEY, secrets.token_hex(6), timeout=None)
        epoch = cache.get(EPOCH_KEY)
    return epoch


def credentials_changed() -> None:
    """A credential was issued, replaced or revoked: every worker's entries stop serving
    desired-state polls (a report re-checks its credential anyway). Now and on commit."""
    _known.clear()
    cache.set(EPOCH_KEY, secrets.token_hex(6), timeout=None)
    transaction.on_commit(lambda: cache.set(EPOCH_KEY, secrets.token_hex(6), timeout=None))


def _on_agent_write(sender, instance, raw=False, **kwargs) -> None:
    if not raw:
        credentials_changed()


def watch() -> None:
    """An agent saved or deleted outside the services (the admin, a node deleted) moves
    the epoch too. Reports write through QuerySet.update, which sends no signal."""
    signals.post_save.connect(_on_agent_write, sender=NodeAgent, dispatch_uid="fleet-credentials-save")
    signals.post_delete.connect(_on_agent_write, sender=NodeAgent, dispatch_uid="fleet-credentials-delete")
