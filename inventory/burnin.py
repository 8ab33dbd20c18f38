"""A card is proven healthy before it is sold. A slot on a node whose agent enrolled
(`Node.burn_in_required`) takes a new lease only with a passing burn-in newer than its last
lease: enrolment asks for one on every card, every release asks again, an operator can ask
any time. The node agent runs the diagnostic and answers with a signed record (fleet
verifies the signature, then calls `burn_in_record`): a pass makes the slot sellable, a
fail opens an incident on it and keeps it out of stock.

Drain-rule health conditions (fleet/conditions.py) are a separate hold on the same slot
(`health_hold`), set and cleared as the agent reports them."""
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction

from .audit import audit_record
from .incidents import incident_close, incident_open
from .models import BurnIn, GpuSlot, Incident, Node, SlotAllocation
from .selectors import catalog_changed


def burn_in_gate_on() -> bool:
    return settings.BURN_IN_BEFORE_SALE


@transaction.atomic
def burn_in_request(*, slot: GpuSlot, reason: str, now: datetime, actor=None) -> BurnIn:
    """Ask the slot's node for a diagnostic; the slot leaves stock until it passes. One
    pending request per slot: asking again returns it."""
    slot = GpuSlot.objects.select_for_update().get(pk=slot.pk)
    pending = BurnIn.objects.filter(slot=slot, finished_at__isnull=True).first()
    if pending:
        return pending
    count = BurnIn.objects.filter(slot=slot).count() + 1
    try:
        with transaction.atomic():
            burn_in = BurnIn.objects.create(slot=slot, op_id=f"burnin:{slot.pk}:{count}", reason=reason,
                                            requested_at=now, requested_by=actor if getattr(actor, "pk", None) else None)
    except IntegrityError:      # a concurrent request won the race
        return BurnIn.objects.get(slot=slot, finished_at__isnull=True)
    if not slot.burn_in_due:
        GpuSlot.objects.filter(pk=slot.pk).update(burn_in_due=True)
        transaction.on_commit(catalog_changed)
    audit_record(actor=actor, action="burn_in_request", obj=slot, at=now,
                 detail={"op_id": burn_in.op_id, "reason": reason})
    return burn_in


def burn_in_request_node(*, node: Node, reason: str, now: datetime, actor=None) -> list[BurnIn]:
    """Every idle slot of the node (a slot in a lease is tested when the lease ends)."""
    busy = set(SlotAllocation.objects.filter(slot__node=node, released_at__isnull=True).values_list("slot_id", flat=True))
    return [burn_in_request(slot=slot, reason=reason, now=now, actor=actor)
            for slot in node.slots.order_by("index") if slot.pk not in busy]


def burn_in_after_reboot(*, node: Node, now: datetime) -> list[BurnIn]:
    """A node that rebooted proves each idle card again (a short diagnostic, unless an
    incident since the card's last pass makes it deep) before its next sale; a card in a
    running lease is tested when that lease ends, as always."""
    if not burn_in_gate_on() or not node.burn_in_required:
        return []
    return burn_in_request_node(node=node, reason=BurnIn.Reason.AFTER_REBOOT, now=now)


def burn_in_after_release(*, slot_ids: list[int], now: datetime) -> None:
    """Cards back from a lease are tested before the next customer gets them."""
    if not burn_in_gate_on():
        return
    for slot in GpuSlot.objects.filter(pk__in=slot_ids, node__burn_in_required=True):
        burn_in_request(slot=slot, reason=BurnIn.Reason.AFTER_LEASE, now=now)


@transaction.atomic
def burn_in_record(*, burn_in: BurnIn, passed: bool, record: dict, signature: str, signed_text: str,
                   at: datetime, now: datetime) -> BurnIn:
    """The node's signed answer. Idempotent per request (fleet checks it is the same record)."""
    burn_in = BurnIn.objects.select_for_update().select_related("slot").get(pk=burn_in.pk)
    if burn_in.finished_at is not None:
        return burn_in
    BurnIn.objects.filter(pk=burn_in.pk).update(finished_at=now, result="pass" if passed else "fail",
                                                 record=record, signature=signature, signed_text=signed_text)
    burn_in.refresh_from_db()
    slot = burn_in.slot
    if passed:
        GpuSlot.objects.filter(pk=slot.pk).update(burn_in_due=False, burn_in_passed_at=at)
        for incident in Incident.objects.filter(slot=slot, source=Incident.Source.BURN_IN, ends_at__isnull=True):
            incident_close(incident=incident, ends_at=max(at, incident.starts_at), now=now,
                           reason=f"burn-in {burn_in.op_id} passed")
    else:
        detail = str(record.get("detail") or "")[:160]
        incident_open(slot=slot, kind=Incident.Kind.DOWN, starts_at=min(at, now), now=now,
                      source=Incident.Source.BURN_IN,
                      reason=f"burn-in {burn_in.op_id} failed on GPU {slot.index}: {detail}".strip(": "))
    transaction.on_commit(catalog_changed)
    audit_record(actor=None, action="burn_in_pass" if passed else "burn_in_fail", obj=slot, at=now,
                 detail={"op_id": burn_in.op_id, "tool": str(record.get("tool", ""))[:40]})
    return burn_in


def burn_in_depth(burn_in: BurnIn) -> str:
    """`deep` (DCGM level 3 on a datacenter card) before a card's first sale, on an
    operator's request and after any incident on the card since its last pass; `short`
    (level 1) before each next lease and after the node rebooted
    (docs/adr/0013-burn-in-by-card-class.md)."""
    short_reasons = (BurnIn.Reason.AFTER_LEASE, BurnIn.Reason.AFTER_REBOOT)
    if burn_in.reason not in short_reasons or burn_in.slot.burn_in_passed_at is None:
        return "deep"
    since = burn_in.slot.burn_in_passed_at
    incident = (Incident.objects.filter(slot=burn_in.slot, starts_at__gte=since).exists() or
                Incident.objects.filter(slot_links__slot=burn_in.slot, starts_at__gte=since).exists())
    return "deep" if incident else "short"


def pending_for_node(node: Node) -> list[BurnIn]:
    """What the node's agent is asked to run now: pending requests on idle slots."""
    busy = SlotAllocation.objects.filter(slot__node=node, released_at__isnull=True).values("slot_id")
    return list(BurnIn.objects.filter(slot__node=node, finished_at__isnull=True).exclude(slot_id__in=busy)
                .select_related("slot").order_by("requested_at", "id"))


@transaction.atomic
def slot_health_hold_set(*, node: Node, index: int, codes: list[str], now: datetime) -> bool:
    """The drain-rule conditions holding a slot out of stock (empty: none). Audited when
    it changes; returns whether it did."""
    hold = ",".join(sorted(set(codes)))[:200]
    slot = GpuSlot.objects.select_for_update().filter(node=node, index=index).first()
    if slot is None or slot.health_hold == hold:
        return False
    GpuSlot.objects.filter(pk=slot.pk).update(health_hold=hold)
    transaction.on_commit(catalog_changed)
    audit_record(actor=None, action="slot_health_hold" if hold else "slot_health_clear", obj=slot, at=now,
                 detail={"conditions": hold, "was": slot.health_hold})
    return True


def last_passed_burn_in(lease_id: int) -> datetime | None:
    """The oldest of the last passing burn-ins of the cards the lease holds: what the
    holder of those cards is told (one query, the allocations joined)."""
    dates = list(GpuSlot.objects.filter(allocations__lease_id=lease_id, allocations__released_at__isnull=True)
                 .values_list("burn_in_passed_at", flat=True))
    return None if not dates or None in dates else min(dates)


def offer_card_facts(offer) -> dict[str, dict]:
    """Per site, what a buyer of this offer is told about the free cards: the oldest of
    their last passing burn-ins (None: no burn-in gate on those nodes) and whether the
    nodes' agents report NVLink between the cards (None: not reported)."""
    from .selectors import free_slots_queryset

    facts: dict[str, dict] = {}
    rows = (free_slots_queryset().filter(node__gpu_model=offer.gpu_model_id, node__gpu_count__gte=offer.gpu_count)
            .values_list("node__site__code", "node__burn_in_required", "burn_in_passed_at", "node__nvlink_reported"))
    for site, required, passed, nvlink in rows:
        fact = facts.setdefault(site, {"burn_in_since": None, "burn_in_gate": False, "nvlink": None})
        if required and passed:
            fact["burn_in_gate"] = True
            fact["burn_in_since"] = min(filter(None, [fact["burn_in_since"], passed]))
        if nvlink is not None:
            fact["nvlink"] = nvlink if fact["nvlink"] is None else fact["nvlink"] and nvlink
    return facts
