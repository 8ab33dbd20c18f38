"""Every write to inventory. Slot allocation locks the candidate nodes in id order, so
concurrent orders for the last card serialise instead of overselling; the partial
unique index on SlotAllocation backs that up at the database."""
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .audit import audit_record
from .models import GpuSlot, Node, Offer, Site, SlotAllocation
from .selectors import SELLABLE_SLOT, catalog_changed, free_slots_queryset


def _stock_changed() -> None:
    transaction.on_commit(catalog_changed)


class SoldOut(Exception):
    """No node at the site has enough free slots for the offer right now."""


def slots_allocate(*, offer: Offer, site: Site, lease_id: int, exclude_node_ids=()) -> list[GpuSlot]:
    """Hold `offer.gpu_count` free slots on one node at `site` for a lease (never on
    `exclude_node_ids`: a migration off a failed node)."""
    with transaction.atomic():
        nodes = list(
            Node.objects.select_for_update()
            .filter(site=site, gpu_model=offer.gpu_model_id, draining=False, gpu_count__gte=offer.gpu_count)
            .exclude(pk__in=list(exclude_node_ids))
            .order_by("id")
        )
        taken = set(
            SlotAllocation.objects.filter(slot__node__in=nodes, released_at__isnull=True).values_list(
                "slot_id", flat=True
            )
        )
        free_by_node: dict[int, list[GpuSlot]] = {n.id: [] for n in nodes}
        for slot in GpuSlot.objects.filter(node__in=nodes, **SELLABLE_SLOT).order_by("node_id", "index"):
            if slot.id not in taken:
                free_by_node[slot.node_id].append(slot)
        fitting = [slots for slots in free_by_node.values() if len(slots) >= offer.gpu_count]
        if not fitting:
            raise SoldOut(offer.slug)
        # Best fit: the fullest node that still fits, to keep whole nodes for multi-GPU offers.
        chosen = min(fitting, key=len)[: offer.gpu_count]
        try:
            with transaction.atomic():
                SlotAllocation.objects.bulk_create(
                    [SlotAllocation(slot=slot, lease_id=lease_id) for slot in chosen]
                )
        except IntegrityError as exc:  # a concurrent writer on a database without row locks
            raise SoldOut(offer.slug) from exc
        _stock_changed()
        return chosen


def sku_free_units_locked(*, gpu_model_id: int) -> int:
    """The sellable free GPUs of one model (a SKU) across the active sites, with the model's
    nodes locked in id order (slots_allocate's order, so the two never deadlock) until the
    transaction ends: a hold rule that counts them decides before anyone else takes one."""
    with transaction.atomic():
        list(Node.objects.select_for_update().filter(gpu_model_id=gpu_model_id).order_by("id").values_list("id"))
        return free_slots_queryset().filter(node__gpu_model_id=gpu_model_id).count()


def slots_release(*, lease_id: int, now: datetime | None = None) -> int:
    """Return a lease's slots to stock; idempotent. Returns how many were released. `now`
    is the caller's clock (a simulated one under `manage.py lifecycle --at`)."""
    with transaction.atomic():
        return slots_release_many(lease_ids=[lease_id], now=now)


def slots_release_many(*, lease_ids: list[int], now: datetime | None = None) -> int:
    """`slots_release` for a batch of leases (a lifecycle sweep's): three statements, not
    three per lease."""
    from .burnin import burn_in_after_release

    now = now or timezone.now()
    open_ = SlotAllocation.objects.filter(lease_id__in=list(lease_ids), released_at__isnull=True)
    slot_ids = list(open_.values_list("slot_id", flat=True))
    if not slot_ids:
        return 0
    released = open_.update(released_at=now)
    if released:
        _stock_changed()
        burn_in_after_release(slot_ids=slot_ids, now=now)
    return released


def node_set_draining(*, node: Node, draining: bool, actor=None, reason: str = "") -> Node:
    """Draining stops new leases on a node; running leases are untouched."""
    with transaction.atomic():
        changed = Node.objects.filter(pk=node.pk).exclude(draining=draining).update(draining=draining)
        if changed:
            _stock_changed()
        node.refresh_from_db(fields=["draining"])
        if changed:
            audit_record(
                actor=actor,
                action="node_drain" if draining else "node_undrain",
                obj=node,
                detail={"reason": reason},
            )
        return node


class NodeRefused(Exception):
    """The node change cannot be saved as asked; the message says why."""


def node_save(*, node: Node, actor, changed: dict[str, tuple]) -> Node:
    """Create or change a node: its GPU slots follow its GPU count (slots 0…n-1 are created;
    slots beyond a lowered count are removed only while no lease ever used them), and every
    change is audited with the old and new values."""
    with transaction.atomic():
        is_new = node.pk is None
        node.save()
        existing = set(node.slots.values_list("index", flat=True))
        GpuSlot.objects.bulk_create([GpuSlot(node=node, index=i) for i in range(node.gpu_count) if i not in existing])
        surplus = node.slots.filter(index__gte=node.gpu_count)
        if surplus.filter(Exists(SlotAllocation.objects.filter(slot=OuterRef("pk")))).exists():
            raise NodeRefused(f"{node.name}: slots at index {node.gpu_count} and above have leases; "
                              "drain the node and let them end first")
        surplus.delete()
        _stock_changed()
        detail = {field: [str(old), str(new)] for field, (old, new) in changed.items()}
        audit_record(actor=actor, action="node_created" if is_new else "node_changed", obj=node, detail=detail)
        return node
