"""The statements of a steady report and of an egress flush (the locked read, the meter), written once as SQL.

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

from inventory.models import GpuSlot, Incident, Node, Offer
from rental.models import Lease

from .models import EgressMeter, InstanceReport, NodeAgent

#: The node facts a report may carry that a steady UPDATE compares with the stored ones.
FACTS = ("agent_version", "public_host", "gpu_library")
_REPORT_FIELDS = ("id", "lease_id", "node_id", "state", "ssh_port", "op_id", "error", "egress_counter",
                  "reported_at", "ports", "pull")


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
def _conversions(model, name: str) -> tuple:
    """A column's expression and the backend's and the field's conversions of a raw value
    (as the ORM applies them: a JSON text parsed, an SQLite timestamp made an aware datetime)."""
    field = model._meta.get_field(name)
    expression = field.get_col(model._meta.db_table)
    return expression, (*connection.ops.get_db_converters(expression), *field.get_db_converters(connection))


def _converted(model, name: str, value):
    expression, steps = _conversions(model, name)
    for step in steps:
        value = step(value, expression, connection)
    return value


class StoredReport(NamedTuple):
    """What a report's steady check compares with (fleet/instance_reports.py `_unchanged`)."""
    lease_id: int
    state: str
    ssh_port: int | None
    op_id: str
    error: dict | None
    egress_counter: int
    reported_at: datetime
    #: The published ports and the image pull as last stored (a copy cached before these
    #: existed unpickles with None: the next report that differs writes them).
    ports: dict | None = None
    pull: dict | None = None


def _read_reports(node_id: int, lease_ids: list[int]) -> dict[int, StoredReport]:
    with connection.cursor() as cursor:
        cursor.execute(_reports_sql(len(lease_ids)), [node_id, *lease_ids])
        rows = cursor.fetchall()
    reports = {}
    for row in rows:
        values = [_converted(InstanceReport, name, value) for name, value in zip(_REPORT_FIELDS, row, strict=True)]
        stored = StoredReport(*values[1:2], *values[3:])
        reports[stored.lease_id] = stored
    return reports


# --- an instance report about to be written, with its lease ----------------------------------

#: What the write of an instance report reads, locking the report's row: its counter and
#: time (the egress ceiling, what was sent since), the lease's term (the meter's term
#: start) and the offer's link speed.
_LOCKED = ((InstanceReport, ("id", "egress_counter", "reported_at")),
           (Lease, ("id", "term", "started_at", "provisioning_started_at", "created_at", "ends_at")),
           (Offer, ("network_gbps",)))


class LockedReport(NamedTuple):
    pk: int
    egress_counter: int
    reported_at: datetime


@functools.cache
def _locked_sql() -> str:
    q = connection.ops.quote_name
    ir, lease, offer = (q(model._meta.db_table) for model, _ in _LOCKED)
    columns = ", ".join(f"{q(model._meta.db_table)}.{_column(model, name)}" for model, names in _LOCKED
                        for name in names)
    lock = f" FOR UPDATE OF {ir}" if connection.features.has_select_for_update_of else ""
    return (f"SELECT {columns} FROM {ir} INNER JOIN {lease} ON {lease}.{_column(Lease, 'id')} = "
            f"{ir}.{_column(InstanceReport, 'lease')} INNER JOIN {offer} ON {offer}.{_column(Offer, 'id')} = "
            f"{lease}.{_column(Lease, 'offer')} WHERE {ir}.{_column(InstanceReport, 'lease')} = %s "
            f"AND {ir}.{_column(InstanceReport, 'node')} = %s{lock}")


def locked_report(lease_id: int, node_id: int) -> tuple[LockedReport | None, Lease, int | None]:
    """The node's stored report of the lease, locked (None: its first), the lease (only the
    fields above loaded; the others load if read) and its offer's network_gbps. One
    statement where the report exists; in the caller's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(_locked_sql(), [lease_id, node_id])
        row = cursor.fetchone()
    if row is None:
        lease = Lease.objects.select_related("offer").get(pk=lease_id)
        return None, lease, lease.offer.network_gbps
    values = iter(row)
    converted = [[_converted(model, name, next(values)) for name in names] for model, names in _LOCKED]
    lease = Lease.from_db(connection.alias, list(_LOCKED[1][1]), converted[1])
    return LockedReport(*converted[0]), lease, converted[2][0]


#: What the write of a steady instance's report sets (fleet/instance_reports.py `_instance_store`).
REPORT_VALUES = ("state", "ssh_port", "op_id", "error", "egress_counter", "reported_at", "ports", "pull")


@functools.cache
def _report_update_sql() -> str:
    assignments = ", ".join(f"{_column(InstanceReport, name)} = %s" for name in REPORT_VALUES)
    return (f"UPDATE {connection.ops.quote_name(InstanceReport._meta.db_table)} SET {assignments} "
            f"WHERE {_column(InstanceReport, 'id')} = %s")


def report_update(pk: int, values: dict) -> None:
    """InstanceReport.objects.filter(pk=pk).update(**values) for the REPORT_VALUES, in a
    statement composed once; each value prepared by its field as the ORM would."""
    prepared = [InstanceReport._meta.get_field(name).get_db_prep_save(values[name], connection)
                for name in REPORT_VALUES]
    with connection.cursor() as cursor:
        cursor.execute(_report_update_sql(), [*prepared, pk])


@functools.cache
def _meter_add_sql() -> str:
    sent = _column(EgressMeter, "bytes_sent")
    return (f"UPDATE {connection.ops.quote_name(EgressMeter._meta.db_table)} SET {sent} = {sent} + %s "
            f"WHERE {_column(EgressMeter, 'lease')} = %s AND {_column(EgressMeter, 'term_start')} = %s "
            f"RETURNING {sent}")


def meter_add(lease_id: int, term_start: datetime, sent: int) -> int:
    """Adds `sent` bytes to the lease's meter of the term (created at 0 the first time) and
    returns its total: one statement, the row locked by the UPDATE itself."""
    values = [sent, lease_id, connection.ops.adapt_datetimefield_value(term_start)]
    with connection.cursor() as cursor:
        cursor.execute(_meter_add_sql(), values)
        row = cursor.fetchone()
        if row is None:                    # the term's first bytes (get_or_create settles a race)
            EgressMeter.objects.get_or_create(lease_id=lease_id, term_start=term_start)
            cursor.execute(_meter_add_sql(), values)
            row = cursor.fetchone()
    return row[0]


# --- a full report's reads: the agent as stored, the node's GPU slots ------------------------

def _columns_of(model) -> list[str]:
    q = connection.ops.quote_name
    return [f"{q(model._meta.db_table)}.{q(f.column)}" for f in model._meta.concrete_fields]


def _from_row(model, values):
    """A model instance from its concrete columns' raw values, converted as the ORM does."""
    fields = model._meta.concrete_fields
    return model.from_db(connection.alias, [f.attname for f in fields],
                         [_converted(model, f.name, v) for f, v in zip(fields, values, strict=True)])


@functools.cache
def _fresh_sql() -> str:
    q = connection.ops.quote_name
    agents, nodes = q(NodeAgent._meta.db_table), q(Node._meta.db_table)
    return (f"SELECT {', '.join(_columns_of(NodeAgent) + _columns_of(Node))} FROM {agents} INNER JOIN {nodes} "
            f"ON {nodes}.{_column(Node, 'id')} = {agents}.{_column(NodeAgent, 'node')} "
            f"WHERE {agents}.{_column(NodeAgent, 'id')} = %s AND {agents}.{_column(NodeAgent, 'credential_hash')} = %s "
            f"AND {agents}.{_column(NodeAgent, 'revoked_at')} IS NULL")


def agent_as_stored(pk: int, credential_hash: str) -> NodeAgent | None:
    """The agent's row and its node, where it still has this credential, unrevoked (None:
    revoked or replaced): NodeAgent.objects.select_related("node") in one statement whose
    text is composed once."""
    with connection.cursor() as cursor:
        cursor.execute(_fresh_sql(), [pk, credential_hash])
        row = cursor.fetchone()
    if row is None:
        return None
    split = len(NodeAgent._meta.concrete_fields)
    agent = _from_row(NodeAgent, row[:split])
    NodeAgent.node.field.set_cached_value(agent, _from_row(Node, row[split:]))
    return agent


@functools.cache
def _slots_sql() -> str:
    q = connection.ops.quote_name
    slots, incidents = q(GpuSlot._meta.db_table), q(Incident._meta.db_table)
    return (f"SELECT {', '.join(_columns_of(GpuSlot))}, EXISTS(SELECT 1 FROM {incidents} WHERE "
            f"{incidents}.{_column(Incident, 'slot')} = {slots}.{_column(GpuSlot, 'id')} AND "
            f"{incidents}.{_column(Incident, 'source')} = %s AND {incidents}.{_column(Incident, 'ends_at')} IS NULL) "
            f"FROM {slots} WHERE {slots}.{_column(GpuSlot, 'node')} = %s")


def gpu_slots(node_id: int) -> list[GpuSlot]:
    """The node's GPU slots, each with `incident_open`: whether a health-check incident of
    it is open (one statement, composed once)."""
    with connection.cursor() as cursor:
        cursor.execute(_slots_sql(), [Incident.Source.HEALTH_CHECK.value, node_id])
        rows = cursor.fetchall()
    slots = []
    for row in rows:
        slot = _from_row(GpuSlot, row[:-1])
        slot.incident_open = bool(row[-1])
        slots.append(slot)
    return slots


# --- the node's stored instance reports, copied in the cache ----------------------------------
# A steady report of a node reads its instances' stored reports to decide that nothing needs
# writing. The copy is read in the round trip that counts the poll (fleet/views.py), so a
# steady report reads no table for it. It holds what the table holds: a report that writes
# drops it before its first write, and once its writes committed puts back the copy with
# the values written (reports.py `_Instances`), so the next report reads no table either.
# A copy read from the table is only added (SET NX): one read before such a write committed
# and put after it never replaces the newer copy. Only a node's own reports write its
# instance reports, and its agent sends one at a time; should a copy still be wrong (two
# reports of one node at once, a lost drop), it lives NODE_EGRESS_FLUSH_SECONDS: an instance
# whose state then went back to what the copy says is stored late by that much.

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
    cache.add(reports_key(node_id), reports, timeout=settings.NODE_EGRESS_FLUSH_SECONDS)
    return reports


def reports_writing(node_id: int) -> None:
    """The node's instance reports are about to be written: the copy goes."""
    cache.delete(reports_key(node_id))


def reports_written(node_id: int, reports: dict[int, StoredReport]) -> None:
    """Once committed, `reports` (what the table holds now for the report's leases) is the
    node's copy."""
    transaction.on_commit(lambda: cache.set(reports_key(node_id), reports,
                                            timeout=settings.NODE_EGRESS_FLUSH_SECONDS))
