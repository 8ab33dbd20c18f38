"""inventory/burnin.py: what the holder of a lease's cards is told of their last burn-in."""
from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inventory.burnin import last_passed_burn_in
from inventory.models import GpuSlot, Node, SlotAllocation


def test_the_oldest_pass_of_the_cards_the_lease_holds_in_one_query(catalog):
    node = Node.objects.filter(gpu_count__gte=3).order_by("pk").first()
    first, second, third = GpuSlot.objects.filter(node=node).order_by("index")[:3]
    now = timezone.now()
    GpuSlot.objects.filter(pk=first.pk).update(burn_in_passed_at=now - timedelta(days=2))
    GpuSlot.objects.filter(pk=second.pk).update(burn_in_passed_at=now - timedelta(days=5))
    SlotAllocation.objects.bulk_create([
        SlotAllocation(slot=first, lease_id=7001), SlotAllocation(slot=second, lease_id=7001),
        SlotAllocation(slot=third, lease_id=7001, released_at=now),        # an earlier holding, given back
        SlotAllocation(slot=third, lease_id=7002)])
    with CaptureQueriesContext(connection) as queries:
        assert last_passed_burn_in(7001) == now - timedelta(days=5)
    assert len(queries) == 1
    assert last_passed_burn_in(7002) is None            # a card that never passed one: no date to tell
    assert last_passed_burn_in(7003) is None            # no cards held
