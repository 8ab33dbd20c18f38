"""Issue 31: the two statements of a steady report, written once as SQL.

Building them through the ORM (a filter of eight terms, an `IN` over the instance reports)
cost more CPU than everything else in the report; the statements are fixed, so their text
is composed once per process from the models' own table and column names, and values are
adapted by the backend's operations as the ORM would (both PostgreSQL and SQLite run them).
Nothing else changes: the same rows are read and written, with the same conditions."""
import functools
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction

from .models import InstanceReport, NodeAgent

#: The node facts a report may carry that a steady UPDATE compares with the stored ones.
FACTS = ("agent_version", "public_host", "gpu_library")
_REPORT_FIELDS = ("id", "lease_id", "node_id", "state", "ssh_port", "op_id", "error", "egress_counter",
                  "reported_at")


def _column(model, name: str) -> str:
    return connection.ops.quote_name(model._meta.get_field(name).column)


@functools.cache
def _update_sql(facts: tuple[str, ...]) -> str:
    q = connection.ops.quote_name
    conditions = " AND ".join(f"{_column(NodeAgent, f)} = %s" for f in
                              ("id", "credential_hash", "public_key", *facts))
    report_at = _column(NodeAgent, "last_report_at")
    return (f"UPDATE {q(NodeAgent._meta.db_table)} SET {_column(NodeAgent, 'last_seq')} = %s, "
            f"{_column(NodeAgent, 'seq_fence')} = %s, "
            f"{_column(NodeAgent, 'last_seen_at')} = %s, {report_at} = CASE WHEN {report_at} IS NULL "
            f"OR {report_at} < %s THEN %s ELSE {report_at} END "
            f"WHERE {conditions} AND {_column(NodeAgent, 'last_seq')} < %s "
            f"AND {_column(NodeAgent, 'seq_fence')} < %s AND {_column(NodeAgent, 'revoked_at')} IS NULL")


def steady_agent_update(agent: NodeAgent, seq: int, facts: dict, now: datetime, *, fence: int,
                        fence_below: int) -> bool:
    """last_seq, seq_fence, last_seen_at := seq, fence, now, and last_report_at := now once
    the stored one is NODE_SEEN_WRITE_SECONDS old — only where the row is this agent's, with
    this credential and key, unrevoked, seq below `seq`, seq_fence below `fence_below`
    (fleet/seq.py), and every given fact as stored. True when that row was updated.

    last_report_at is indexed (the admin's "not reporting" filter): a row whose indexed
    columns keep their values is updated in place by PostgreSQL (a HOT update, no index
    entries), where writing it on every report added an entry to each of the table's five
    indexes per poll. The heartbeat is therefore exact to NODE_SEEN_WRITE_SECONDS (60 s),
    well inside NODE_REPORT_STALE_AFTER (3 min)."""
    names = tuple(f for f in FACTS if f in facts)
    adapt = connection.ops.adapt_datetimefield_value
    at, stale_before = adapt(now), adapt(now - timedelta(seconds=settings.NODE_SEEN_WRITE_SECONDS))
    with connection.cursor() as cursor:
        cursor.execute(_update_sql(names), [seq, fence, at, stale_before, at, agent.pk, agent.credential_hash,
                                            agent.public_key, *(facts[f] for f in names), seq, fence_below])
        return cursor.rowcount == 1


@functools.cache
def _reports_sql(count: int) -> str:
    q = connection.ops.quote_name
    columns = ", ".join(_column(InstanceReport, f) for f in _REPORT_FIELDS)
    return (f"SELECT {columns} FROM {q(InstanceReport._meta.db_table)} WHERE {_column(InstanceReport, 'node_id')} "
            f"= %s AND {_column(InstanceReport, 'lease_id')} IN ({', '.join(['%s'] * count)})")


@functools.cache
def _converters() -> list:
    """Per column, the backend's and the field's conversions of a raw value (as the ORM
    applies them: a JSON text parsed, an SQLite timestamp made an aware datetime)."""
    out = []
    for name in _REPORT_FIELDS:
        field = InstanceReport._meta.get_field(name)
        steps = [*connection.ops.get_db_converters(field.get_col(InstanceReport._meta.db_table)),
                 *field.get_db_converters(connection)]
        out.append((field.get_col(InstanceReport._meta.db_table), steps))
    return out


class StoredReport(NamedTuple):
    """What a report's steady check compares with (fleet/reports.py `_unchanged`)."""
    lease_id: int
    state: str
    ssh_port: int | None
    op_id: str
    error: dict | None
    egress_counter: int
    reported_at: datetime


def _read_reports(node_id: int, lease_ids: list[int]) -> dict[int, StoredReport]:
    with connection.cursor() as cursor:
        cursor.execute(_reports_sql(len(lease_ids)), [node_id, *lease_ids])
        rows = cursor.fetchall()
    reports = {}
    for row in rows:
        values = []
        for value, (expression, steps) in zip(row, _converters(), strict=True):
            for step in steps:
                value = step(value, expression, connection)
            values.append(value)
        stored = StoredReport(*values[1:2], *values[3:])
        reports[stored.lease_id] = stored
    return reports


# --- the node's stored instance reports, copied in the cache ----------------------------------
# A steady report of a node reads its instances' stored reports to decide that nothing needs
# writing. The copy is read in the round trip that counts the poll (fleet/views.py), so a
# steady report reads no table for it. It holds exactly what the table held when read, and
# is dropped before and after every write of the node's instance reports (in the
# transaction, and on commit; reports.py `_instance_store`). Should both drops be lost to a
# cache outage, the copy is at most NODE_EGRESS_FLUSH_SECONDS old (its lifetime): an
# instance whose state then went back to what the copy says is stored late by that much.

def reports_key(node_id: int) -> str:
    return f"fleet:instance-reports:{node_id}"


def stored_reports(node_id: int, lease_ids: list[int], found: dict) -> dict[int, StoredReport]:
    """The node's stored instance reports of these leases (those that have one), from the
    copy `found` holds when it covers them all, else from the table (and copied)."""
    ids = sorted(set(lease_ids))
    copy = found.get(reports_key(node_id))
    if isinstance(copy, dict) and all(i in copy for i in ids):
        return {i: copy[i] for i in ids}
    reports = _read_reports(node_id, ids)
    cache.set(reports_key(node_id), reports, timeout=settings.NODE_EGRESS_FLUSH_SECONDS)
    return reports


def reports_written(node_id: int) -> None:
    """An instance report of the node is being written: the copy goes, now and on commit."""
    cache.delete(reports_key(node_id))
    transaction.on_commit(lambda: cache.delete(reports_key(node_id)))
