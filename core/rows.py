"""Row helpers every layer above may use (inventory is the lowest Django layer)."""
from django.db import connection

#: Rows per INSERT statement: well under SQLite's bound-variable limit for our widest rows.
CHUNK = 200


def insert_once(obj) -> bool:
    """INSERT … ON CONFLICT DO NOTHING RETURNING id for an unsaved model instance: True and
    `obj.pk` set when the row was inserted, False when a unique constraint already holds such
    a row. One statement (PostgreSQL, SQLite ≥ 3.35) where a savepoint around an INSERT that
    may fail takes three, and the caller's transaction carries on either way — the lifecycle
    sweeps claim a notice and a notifications-ledger row per due lease. Save-time field
    defaults (auto_now, callables) apply as in save(); signals are not sent."""
    return bool(insert_many_once([obj]))


def insert_many_once(objs: list, key: tuple[str, ...] = ()) -> list:
    """`insert_once` for many unsaved instances of one model, a statement per CHUNK rows:
    returns the instances that were inserted (their pk set), in the given order; the others
    conflicted with a row a unique constraint already holds (or an earlier one of `objs`).
    `key`: attribute names that tell the objects apart (unique within `objs`), read back with
    RETURNING to know which rows went in (compared as text: ids and strings, not datetimes) — a
    single object needs none."""
    if not objs:
        return []
    if len(objs) > 1 and not key:
        raise ValueError("insert_many_once: several objects need a key to tell which were inserted")
    meta = objs[0]._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    by_attname = {f.attname: f for f in meta.concrete_fields}
    key_fields = [by_attname[name] for name in key]
    quote = connection.ops.quote_name
    inserted = []
    for start in range(0, len(objs), CHUNK):
        chunk = objs[start:start + CHUNK]
        keyed = {tuple(str(getattr(o, f.attname)) for f in key_fields): o for o in chunk}
        if len(keyed) != len(chunk):
            raise ValueError(f"insert_many_once: the key {key} is not unique within the objects")
        row = f"({', '.join(['%s'] * len(fields))})"
        sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
               f"VALUES {', '.join([row] * len(chunk))} ON CONFLICT DO NOTHING "
               f"RETURNING {', '.join(quote(f.column) for f in [meta.pk, *key_fields])}")
        params = [f.get_db_prep_save(f.pre_save(o, True), connection) for o in chunk for f in fields]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        for pk, *values in rows:
            obj = keyed[tuple(str(v) for v in values)] if key_fields else chunk[0]
            obj.pk = pk
            obj._state.adding, obj._state.db = False, connection.alias
        inserted.extend(o for o in chunk if not o._state.adding)
    return inserted
