"""Two polls of one node issuing the first op of a lease at once (fleet/desired.py `_issue`).

Neither poll finds the lease's IssuedOp row, so both insert one; the unique constraint
(one row per lease and node) lets the first in, and the second's INSERT waits for it and then
fails. The second poll must then answer from the row the first one committed: the same op_id
when it wants the same thing, the next counter when it wants something else — never an error
to the node, never a second row.

The race is made, not hoped for: the first poll keeps its transaction open until
PostgreSQL shows the second one blocked on its row, then commits. SQLite has no concurrent
writers, so these run on PostgreSQL only."""
import threading

import pytest
from django.db import transaction
from django.utils import timezone

from fleet.desired import Wanted, _issue
from fleet.models import IssuedOp
from tests.billing.races import another_connection_waits_for_my_locks, in_threads, wait_until
from tests.conftest import ON_POSTGRES

from .conftest import node_of

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not ON_POSTGRES, reason="two concurrent writers need DATABASE_URL=postgres://…")]


def race(lease, node, first_wants: Wanted, second_wants: Wanted) -> tuple[str, str, list[str]]:
    """The two polls' op_ids, and what happened in order."""
    now = timezone.now()
    first_inserted, seen, mutex = threading.Event(), [], threading.Lock()

    def happened(what):
        with mutex:
            seen.append(what)

    def first():
        with transaction.atomic():
            op_id = _issue(lease=lease, node=node, wanted=first_wants, restarts=0, now=now)
            first_inserted.set()
            happened("the second poll waits for the first's row" if wait_until(another_connection_waits_for_my_locks)
                     else "nobody waited")
        return op_id

    def second():
        assert first_inserted.wait(30), "the first poll never inserted"
        op_id = _issue(lease=lease, node=node, wanted=second_wants, restarts=0, now=now)
        happened("second poll answered")
        return op_id

    one, two = in_threads(first, second)
    for result in (one, two):
        if isinstance(result, BaseException):
            raise result
    return one, two, seen


def test_two_polls_issuing_the_same_first_op_at_once_both_answer_it(paid_lease):
    lease = paid_lease()
    node = node_of(lease)
    IssuedOp.objects.filter(lease=lease).delete()

    one, two, seen = race(lease, node, Wanted("running", "keep"), Wanted("running", "keep"))

    assert seen == ["the second poll waits for the first's row", "second poll answered"]
    assert one == two == f"{lease.pk}:running:1"
    assert list(IssuedOp.objects.filter(lease=lease).values_list("node_id", "want", "disk", "counter", "op_id")) == [
        (node.pk, "running", "keep", 1, f"{lease.pk}:running:1")]


def test_a_poll_that_lost_the_race_for_a_different_want_issues_the_next_op(paid_lease):
    """The first poll issued "running"; the second, a moment later, wants the instance stopped:
    it answers with the next counter and the row says so."""
    lease = paid_lease()
    node = node_of(lease)
    IssuedOp.objects.filter(lease=lease).delete()

    one, two, seen = race(lease, node, Wanted("running", "keep"), Wanted("stopped", "keep"))

    assert seen == ["the second poll waits for the first's row", "second poll answered"]
    assert (one, two) == (f"{lease.pk}:running:1", f"{lease.pk}:stopped:2")
    assert list(IssuedOp.objects.filter(lease=lease).values_list("want", "counter", "op_id")) == [
        ("stopped", 2, f"{lease.pk}:stopped:2")]
