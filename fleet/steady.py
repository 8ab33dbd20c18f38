"""Issue 31: the two statements of a steady report, written once as SQL.

Building them through the ORM (a filter of eight terms, an `IN` over the instance reports)
cost more CPU than everything else in the report; the statements are fixed, so their text
is composed once per process from the models' own table and column names, and values are
adapted by the backend's operations as the ORM would (both PostgreSQL and SQLite run them).
Nothing else changes: the same rows are read and written, with the same conditions."""
from datetime import datetime
from functools import cache

from django.db import connection

from .models import InstanceReport, NodeAgent

#: The node facts a report may carry that a steady UPDATE compares with the stored ones.
FACTS = ("agent_version", "public_host", "gpu_library")
_REPORT_FIELDS = ("id", "lease_id", "node_id", "state", "ssh_port", "op_id", "error", "egress_counter",
                  "reported_at")


def _column(model, name: str) -> str:
    return connection.ops.quote_name(model._meta.get_field(name).column)


@cache
def _update_sql(facts: tuple[str, ...]) -> str:
    q = connection.ops.quote_name
    conditions = " AND ".join(f"{_column(NodeAgent, f)} = %s" for f in
                              ("id", "credential_hash", "public_key", *facts))
    return (f"UPDATE {q(NodeAgent._meta.db_table)} SET {_column(NodeAgent, 'last_seq')} = %s, "
            f"{_column(NodeAgent, 'last_seen_at')} = %s, {_column(NodeAgent, 'last_report_at')} = %s "
            f"WHERE {conditions} AND {_column(NodeAgent, 'last_seq')} < %s "
            f"AND {_column(NodeAgent, 'revoked_at')} IS NULL")


def steady_agent_update(agent: NodeAgent, seq: int, facts: dict, now: datetime) -> bool:
    """last_seq, last_seen_at, last_report_at := seq, now, now — only where the row is this
    agent's, with this credential and key, unrevoked, seq below `seq`, and every given fact
    as stored. True when that row was updated."""
    names = tuple(f for f in FACTS if f in facts)
    at = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.execute(_update_sql(names), [seq, at, at, agent.pk, agent.credential_hash, agent.public_key,
                                            *(facts[f] for f in names), seq])
        return cursor.rowcount == 1


@cache
def _reports_sql(count: int) -> str:
    q = connection.ops.quote_name
    columns = ", ".join(_column(InstanceReport, f) for f in _REPORT_FIELDS)
    return (f"SELECT {columns} FROM {q(InstanceReport._meta.db_table)} WHERE {_column(InstanceReport, 'node_id')} "
            f"= %s AND {_column(InstanceReport, 'lease_id')} IN ({', '.join(['%s'] * count)})")


def instance_reports(node_id: int, lease_ids: list[int]) -> list[InstanceReport]:
    """The node's stored instance reports of these leases (model instances, values converted
    as the ORM converts them)."""
    ids = sorted(set(lease_ids))
    return list(InstanceReport.objects.raw(_reports_sql(len(ids)), [node_id, *ids]))
