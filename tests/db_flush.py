"""Between transactional tests on PostgreSQL, the tables are emptied with DELETE, not TRUNCATE.

pytest-django ends a ``transaction=True`` test (a live server, real Celery workers, racing
threads) with Django's flush, which on PostgreSQL is one TRUNCATE of every table (84): a new
file for each table and index, about half a second on an idle machine and over a second on a
busy CI one, to empty tables that hold a few rows. DELETE does it in ~20 ms. Django makes its
foreign keys on PostgreSQL DEFERRABLE INITIALLY DEFERRED and runs the flush in one
transaction, so the tables' order does not matter. Sequences go on counting either way
(TRUNCATE without RESTART IDENTITY); a flush that resets them or cascades keeps Django's own
statement. The storefront itself never flushes: only the suite's cleanup changes."""
from django.db.backends.postgresql.operations import DatabaseOperations

_truncate = DatabaseOperations.sql_flush


def sql_flush_by_delete(self, style, tables, *, reset_sequences=False, allow_cascade=False):
    if reset_sequences or allow_cascade or not tables:
        return _truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]


def install() -> None:
    DatabaseOperations.sql_flush = sql_flush_by_delete
