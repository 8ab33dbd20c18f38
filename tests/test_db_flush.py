"""tests/db_flush.py: on PostgreSQL, the flush after a transactional test deletes every row
(children before or after their parents alike: the foreign keys are deferred) and leaves the
sequences counting; a flush that resets sequences keeps Django's TRUNCATE."""
import pytest
from django.core.management.color import no_style
from django.db import connection

from inventory.models import GpuModel, GpuSlot, Node, Offer, Site
from tests.conftest import ON_POSTGRES

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def tables() -> list[str]:
    return connection.introspection.django_table_names(only_existing=True, include_views=False)


def test_the_flush_deletes_rows_of_linked_tables_in_any_order(catalog):
    assert ON_POSTGRES
    statements = connection.ops.sql_flush(no_style(), tables())
    assert statements and all(s.startswith("DELETE FROM ") for s in statements)
    # Django lists the tables in no order of their keys: the deferred keys let any order work
    assert Node.objects.exists() and GpuSlot.objects.exists()
    next_id = Site.objects.order_by("-pk").values_list("pk", flat=True)[0] + 1
    connection.ops.execute_sql_flush(statements)
    for model in (Site, GpuModel, Offer, Node, GpuSlot):
        assert not model.objects.exists(), model
    assert Site.objects.create(code="NEW-1", name="New").pk >= next_id   # sequences go on counting


def test_a_flush_that_resets_sequences_is_djangos_truncate():
    statements = connection.ops.sql_flush(no_style(), tables(), reset_sequences=True)
    assert statements[0].startswith("TRUNCATE ") and "RESTART IDENTITY" in statements[0]
