"""Row helpers every layer above may use (inventory is the lowest Django layer)."""
from django.db import connection


def insert_once(obj) -> bool:
    """INSERT … ON CONFLICT DO NOTHING RETURNING id for an unsaved model instance: True and
    `obj.pk` set when the row was inserted, False when a unique constraint already holds such
    a row. One statement (PostgreSQL, SQLite ≥ 3.35) where a savepoint around an INSERT that
    may fail takes three, and the caller's transaction carries on either way — the lifecycle
    sweeps claim a notice and a notifications-ledger row per due lease. Save-time field
    defaults (auto_now, callables) apply as in save(); signals are not sent."""
    meta = obj._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING RETURNING {quote(meta.pk.column)}")
    with connection.cursor() as cursor:
        cursor.execute(sql, [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields])
        row = cursor.fetchone()
    if row is None:
        return False
    obj.pk = row[0]
    obj._state.adding, obj._state.db = False, connection.alias
    return True
