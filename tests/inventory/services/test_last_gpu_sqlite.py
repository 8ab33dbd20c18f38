"""The last GPU on SQLite's path. There `select_for_update` locks nothing (SQLite serialises
writers instead), so what stops two orders holding one card is the partial unique index on
live slot allocations, turned into SoldOut by slots_allocate. The race is interleaved by
hand: a rival's allocation lands between this order's read of the free slots and its
insert. (The threaded race with row locks is tests/ops/lifecycle/test_races.py, PostgreSQL.)"""
import pytest

from billing.models import Invoice
from billing.services import checkout_place_order
from inventory.models import GpuSlot, Offer, Site, SlotAllocation
from inventory.services import SoldOut
from rental.models import Image, Lease

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
RIVAL_LEASE = 10**9


def place(customer):
    return checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                site=Site.objects.get(code="DFW-1"), term="week",
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY)


@pytest.fixture
def last_card(catalog):
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    slots = list(GpuSlot.objects.filter(node__site=site, node__gpu_model=offer.gpu_model, in_service=True)
                 .order_by("node_id", "index"))
    SlotAllocation.objects.bulk_create([SlotAllocation(slot=s, lease_id=RIVAL_LEASE + 1 + i)
                                        for i, s in enumerate(slots[1:])])
    return slots[0]


def test_a_rival_taking_the_card_between_read_and_insert_makes_this_order_sold_out(
        last_card, customer, monkeypatch):
    manager, real_bulk_create = SlotAllocation.objects, SlotAllocation.objects.bulk_create

    def rival_commits_first(objs, *args, **kwargs):
        assert [a.slot_id for a in objs] == [last_card.pk]  # this order chose the last card…
        real_bulk_create([SlotAllocation(slot=last_card, lease_id=RIVAL_LEASE)])  # …the rival got it first
        return real_bulk_create(objs, *args, **kwargs)

    monkeypatch.setattr(manager, "bulk_create", rival_commits_first)
    with pytest.raises(SoldOut):
        place(customer)
    monkeypatch.undo()
    # Nothing half-made: no lease, no invoice, and never two live holders of one card.
    assert not Lease.objects.exists() and not Invoice.objects.exists()
    assert SlotAllocation.objects.filter(slot=last_card, released_at__isnull=True).count() <= 1


def test_one_order_gets_the_last_card_the_next_is_sold_out(last_card, customer, other_customer):
    lease, _ = place(customer)
    assert SlotAllocation.objects.get(slot=last_card, released_at__isnull=True).lease_id == lease.pk
    with pytest.raises(SoldOut):
        place(other_customer)
    assert Lease.objects.count() == 1 and Invoice.objects.count() == 1
