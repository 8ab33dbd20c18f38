"""The guarded update every lease transition is (`UPDATE … WHERE id = ? AND state IN (…)
[AND deadline condition]`, with its LeaseEvents in one INSERT), for rental/services.py and
rental/disk_keys.py, and the refusal a transition raises."""
from datetime import datetime

from django.db.models import Case, Q, Value, When

from .events import event_row as _event_row
from .events import events_record
from .models import Lease


class TransitionRefused(Exception):
    """The lease is not in a state that allows this; the message says why."""


def _transition(lease_id: int, *, to: str, from_states, now: datetime, kind: str, actor=None, reason="",
                when: Q | None = None, data=None, **fields) -> str | None:
    """Guarded update; returns the state it left, or None when another run got there first.
    One lease of `_transition_many`."""
    left = _transition_many([lease_id], to=to, from_states=from_states, now=now, kind=kind, actor=actor,
                            reason=reason, when=when, data=data, change=fields)
    return left.get(lease_id)


def _transition_many(lease_ids, *, to: str, from_states, now: datetime, kind: str, actor=None, reason="",
                     when: Q | None = None, read: tuple[str, ...] = (), change=None, data=None) -> dict[int, str]:
    """The guarded update of a batch of leases: {lease id: the state it left} for those that
    were still in `from_states` (and `when`); the others another run got to first. The rows
    are locked while read, in id order (a no-op on SQLite, which serialises writers): without
    the lock, a payment that read `active` and then waited for the sweep's `suspended` found
    its `state = 'active'` update matching nothing and credited the renewal to the balance
    instead of resuming the lease. Then one UPDATE (per-lease values as CASE) and one INSERT of
    the LeaseEvents. `change`/`data`/`reason`: one value for all, or a function of the locked
    row (a dict of "pk", "state" and the `read` fields; `data` also gets the row's changes)."""
    candidates = Lease.objects.select_for_update().filter(pk__in=list(lease_ids), state__in=list(from_states))
    if when is not None:
        candidates = candidates.filter(when)
    rows = list(candidates.order_by("pk").values("pk", "state", *read))
    if not rows:
        return {}
    changes = {row["pk"]: (change(row) if callable(change) else change) or {} for row in rows}
    guard = Lease.objects.filter(pk__in=list(changes), state__in=list(from_states)).filter(when or Q())
    if not guard.update(state=to, **_per_row_values(Lease, changes)):
        return {}
    events_record([_event_row(row["pk"], kind=kind, now=now, actor=actor, from_state=row["state"], to_state=to,
                              reason=reason(row) if callable(reason) else reason,
                              data=data(row, changes[row["pk"]]) if callable(data) else data) for row in rows])
    return {row["pk"]: row["state"] for row in rows}


def _per_row_values(model, changes: dict[int, dict]) -> dict:
    """UPDATE values for rows that each get their own: a field every row gives the same value
    is that value, else a CASE on the primary key."""
    fields = {name for values in changes.values() for name in values}
    out = {}
    for name in fields:
        values = {pk: row[name] for pk, row in changes.items()}
        distinct = set(values.values())
        if len(distinct) == 1:
            out[name] = distinct.pop()
            continue
        field = model._meta.get_field(name)
        out[name] = Case(*[When(pk=pk, then=Value(value, output_field=field)) for pk, value in values.items()],
                         output_field=field)
    return out
