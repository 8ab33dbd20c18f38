"""Burn-in, storefront side (docs/adr/0013): a card on an enrolled node is sold only with a passing,
signed burn-in newer than its last lease; a failed one opens an incident and keeps the
card out of stock; named health conditions follow one table of rules (warn, drain,
incident). The node here is the protocol-exact FakeNode (real Ed25519 key); the real agent
runs the same path in tests/nodeagent/test_burn_in_agent.py."""
import pytest
from django.utils import timezone

from fleet.crypto import canonical_json

from .conftest import node_of, rfc3339

pytestmark = pytest.mark.django_db


@pytest.fixture
def gate_on(settings):
    settings.BURN_IN_BEFORE_SALE = True


def burn_in_record(fake, request, *, result="pass", tests=None, **extra):
    record = {"kind": "burn_in", "node": fake.node.name, "op_id": request["op_id"],
              "gpu_index": request["gpu"], "gpu_uuid": f"GPU-{request['gpu']}", "at": rfc3339(timezone.now()),
              "tool": "dcgmi", "tool_version": "3.3.5", "level": request["level"],
              "tests": tests or [{"name": "Memory", "category": "Hardware", "status": "pass" if result == "pass"
                                  else "fail", "info": ""}],
              "counters_before": {}, "counters_after": {}, "result": result, "detail": "", **extra}
    return {**record, "signature": fake.sign(canonical_json(record))}


def asked(fake) -> list[dict]:
    response = fake.desired()
    assert response.status_code == 200
    return response.json()["burn_in"]


def free_gpus(node):
    from inventory.selectors import nodes_with_free_counts

    return nodes_with_free_counts(pk=node.pk).get().free


def a_node(gpus=2):
    from inventory.models import Node

    return Node.objects.filter(gpu_count=gpus, gpu_model__offers__slug="rtx-3090").order_by("name").first()


def test_enrolment_asks_every_card_for_a_burn_in_and_takes_it_out_of_stock(catalog, gate_on, enrol):
    node = a_node()
    before = free_gpus(node)
    assert before == node.gpu_count
    fake = enrol(node)
    node.refresh_from_db()
    assert node.burn_in_required
    requests = asked(fake)
    assert sorted(r["gpu"] for r in requests) == list(range(node.gpu_count))
    assert {r["level"] for r in requests} == {2}
    assert {r["depth"] for r in requests} == {"deep"}    # before the first sale
    assert free_gpus(node) == 0                      # nothing sold before a burn-in


def test_a_passing_record_makes_the_card_sellable_and_a_failing_one_opens_an_incident(catalog, gate_on, enrol):
    from inventory.models import BurnIn, GpuSlot, Incident

    node = a_node()
    fake = enrol(node)
    first, second = sorted(asked(fake), key=lambda r: r["gpu"])[:2]
    answer = fake.report(evidence=[burn_in_record(fake, first),
                                   burn_in_record(fake, second, result="fail", detail="Memory test failed")]).json()
    assert answer["accepted"] == ["evidence[0]", "evidence[1]"], answer
    passed = GpuSlot.objects.get(node=node, index=first["gpu"])
    failed = GpuSlot.objects.get(node=node, index=second["gpu"])
    assert not passed.burn_in_due and passed.burn_in_passed_at is not None
    assert failed.burn_in_due and not failed.in_service
    incident = Incident.objects.get(slot=failed, ends_at__isnull=True)
    assert incident.source == Incident.Source.BURN_IN and "Memory test failed" in incident.reason
    assert free_gpus(node) == 1
    assert BurnIn.objects.get(op_id=first["op_id"]).result == "pass"
    assert asked(fake) == []                # a failed card waits for the operator (repair, then re-test)

    from inventory.burnin import burn_in_request_node
    from inventory.models import BurnIn as B
    burn_in_request_node(node=node, reason=B.Reason.OPERATOR, now=timezone.now())
    retest = asked(fake)
    assert [r["gpu"] for r in retest] == [first["gpu"], second["gpu"]]
    assert free_gpus(node) == 0             # an operator's re-test takes the cards out of stock too
    fake.report(evidence=[burn_in_record(fake, r) for r in retest])
    failed.refresh_from_db()
    assert failed.in_service and not failed.burn_in_due
    assert not Incident.objects.filter(slot=failed, ends_at__isnull=True).exists()   # closed by the pass
    assert free_gpus(node) == 2


def test_a_record_is_counted_once_only_for_what_was_asked(catalog, gate_on, enrol):
    from inventory.models import GpuSlot

    node = a_node()
    fake = enrol(node)
    request = sorted(asked(fake), key=lambda r: r["gpu"])[0]
    good = burn_in_record(fake, request)
    other_card = burn_in_record(fake, {**request, "gpu": request["gpu"] + 1})
    invented = burn_in_record(fake, {**request, "op_id": "burnin:999999:1"})
    forged = {**burn_in_record(fake, request), "result": "pass", "tool": "forged"}   # signature no longer matches
    answer = fake.report(evidence=[other_card, invented, forged]).json()
    assert {r["error"] for r in answer["refused"]} == {"not_requested", "bad_signature"}
    assert GpuSlot.objects.get(node=node, index=request["gpu"]).burn_in_due
    assert fake.report(evidence=[good]).json()["accepted"] == ["evidence[0]"]
    again = fake.report(evidence=[good]).json()                   # resent: harmless
    assert again["accepted"] == ["evidence[0]"]
    conflicting = burn_in_record(fake, request, result="fail")
    assert fake.report(evidence=[conflicting]).json()["refused"] == [
        {"item": "evidence[0]", "error": "conflicting_evidence"}]
    assert not GpuSlot.objects.get(node=node, index=request["gpu"]).burn_in_due


def test_every_lease_end_asks_for_a_new_burn_in_before_the_next_customer(catalog, gate_on, enrol, paid_lease,
                                                                           client):
    from inventory.models import BurnIn, GpuSlot, Node
    from inventory.services import slots_release

    node = Node.objects.filter(site__code="DFW-1", gpu_model__offers__slug="rtx-3090").order_by("name").first()
    Node.objects.filter(site__code="DFW-1").exclude(pk=node.pk).update(draining=True)   # the lease lands here
    fake = enrol(node)
    assert fake.report(evidence=[burn_in_record(fake, r) for r in asked(fake)]).status_code == 200
    assert free_gpus(node) == node.gpu_count
    lease = paid_lease()
    slot = GpuSlot.objects.get(allocations__lease_id=lease.pk, allocations__released_at__isnull=True)
    assert node_of(lease) == node
    assert asked(fake) == []                         # a card in a lease is never tested
    client.force_login(lease.customer)
    page = client.get(f"/leases/{lease.pk}/").content.decode()
    assert "passed a burn-in diagnostic on" in page     # the buyer is told when
    slots_release(lease_id=lease.pk, now=timezone.now())
    slot.refresh_from_db()
    assert slot.burn_in_due
    assert BurnIn.objects.get(slot=slot, finished_at__isnull=True).reason == BurnIn.Reason.AFTER_LEASE
    assert [(r["gpu"], r["depth"]) for r in asked(fake)] == [(slot.index, "short")]
    assert free_gpus(node) == node.gpu_count - 1
    # an incident on the card since its last pass makes the next one deep
    from inventory.incidents import incident_open

    incident_open(slot=slot, starts_at=timezone.now(), reason="Xid 79", now=timezone.now())
    assert [(r["gpu"], r["depth"]) for r in asked(fake)] == [(slot.index, "deep")]


def test_without_the_gate_nothing_is_asked(catalog, enrol):
    node = a_node()
    fake = enrol(node)
    assert asked(fake) == []
    assert free_gpus(node) == node.gpu_count


def gpu_item(index, conditions, **extra):
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA RTX 3090", "memory_mb": 24576,
            "driver": "550.54.15", "cuda": "12.4", "temperature_c": 40, "ecc_uncorrected": 0,
            "xid_errors": [], "healthy": True, "problem": "", "conditions": conditions, **extra}


def test_conditions_follow_the_rules_warn_drain_incident(catalog, enrol):
    from inventory.models import GpuSlot, Incident

    node = a_node()
    fake = enrol(node)
    report = fake.report(gpus=[
        gpu_item(0, [{"code": "xid_application", "detail": "application Xid 13"},
                     {"code": "clocks_throttled_power", "detail": "clocks slowed"}], xid_errors=[13]),
        gpu_item(1, [{"code": "row_remap_pending", "detail": "row remapping pending"}]),
    ])
    assert report.status_code == 200
    assert not Incident.objects.filter(slot__node=node, ends_at__isnull=True).exists()  # warn: nothing opens
    assert GpuSlot.objects.get(node=node, index=0).health_hold == ""
    assert GpuSlot.objects.get(node=node, index=1).health_hold == "row_remap_pending"   # drain
    assert free_gpus(node) == node.gpu_count - 1
    fake.report(gpus=[gpu_item(0, [{"code": "row_remap_failed", "detail": "row remapping failed"}]),
                      gpu_item(1, [])])
    incident = Incident.objects.get(slot__node=node, slot__index=0, ends_at__isnull=True)
    assert "row remapping failed" in incident.reason                                      # incident
    assert GpuSlot.objects.get(node=node, index=1).health_hold == ""                     # cleared
    fake.report(gpus=[gpu_item(0, []), gpu_item(1, [])])
    assert not Incident.objects.filter(slot__node=node, ends_at__isnull=True).exists()


def test_an_older_agent_without_conditions_keeps_its_healthy_verdict(catalog, enrol):
    from inventory.models import Incident

    node = a_node()
    fake = enrol(node)
    item = gpu_item(1, None, healthy=False, problem="3 uncorrected ECC errors")
    item.pop("conditions")
    fake.report(gpus=[gpu_item(0, None), item])
    assert Incident.objects.get(slot__node=node, slot__index=1, ends_at__isnull=True)


def test_reported_topology_drives_the_link_and_shows_on_the_node(catalog, enrol):
    node = a_node()
    fake = enrol(node)
    topology = {"pcie_gen": 4, "pcie_max_gen": 4, "pcie_width": 16, "pcie_max_width": 16,
                "nvlink_active": 0, "nvlink_peers": [], "mig": False}
    fake.report(gpus=[gpu_item(i, [], topology=topology) for i in range(node.gpu_count)])
    node.refresh_from_db()
    assert node.nvlink_reported is False
    fake.report(gpus=[gpu_item(i, [], topology={**topology, "nvlink_active": 4,
                                                  "nvlink_peers": [j for j in range(node.gpu_count) if j != i]})
                      for i in range(node.gpu_count)])
    node.refresh_from_db()
    assert node.nvlink_reported is True


def test_the_recommendation_shards_as_pcie_when_no_node_reports_nvlink(catalog, enrol):
    from inventory.models import Node
    from inventory.selectors import _sizing_candidates

    h100 = Node.objects.filter(gpu_model__interconnect__sharding="nvswitch").select_related("gpu_model").first()
    before = {c.offer_slug: c.link for c in _sizing_candidates(None) if c.gpu_name == h100.gpu_model.name}
    assert set(before.values()) == {"nvswitch"}
    Node.objects.filter(gpu_model=h100.gpu_model).update(nvlink_reported=False)
    after = {c.offer_slug: c.link for c in _sizing_candidates(None) if c.gpu_name == h100.gpu_model.name}
    assert set(after.values()) == {"pcie"} and after.keys() == before.keys()
    Node.objects.filter(pk=h100.pk).update(nvlink_reported=True)      # one node proves NVLink works
    assert {c.link for c in _sizing_candidates(None) if c.gpu_name == h100.gpu_model.name} == {"nvswitch"}


BOOT_A = "0b9f6a34-8f53-4b8e-9a7c-6f2d1c0e5a11"
BOOT_B = "5c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"


def test_a_reboot_asks_each_idle_card_for_a_short_burn_in_before_its_next_sale(catalog, gate_on, enrol,
                                                                                 paid_lease):
    """The boot id a node reports changes only when it rebooted: its idle cards leave stock
    until a short diagnostic passes again (deep where an incident hit the card since its
    last pass); a card in a lease waits for the lease's end; the same boot id asks nothing."""
    from inventory.incidents import incident_open
    from inventory.models import BurnIn, GpuSlot, Node

    node = Node.objects.filter(site__code="DFW-1", gpu_model__offers__slug="rtx-3090").order_by("name").first()
    Node.objects.filter(site__code="DFW-1").exclude(pk=node.pk).update(draining=True)   # the lease lands here
    fake = enrol(node)
    assert fake.report(boot_id=BOOT_A, evidence=[burn_in_record(fake, r) for r in asked(fake)]).status_code == 200
    assert free_gpus(node) == node.gpu_count
    lease = paid_lease()
    busy = GpuSlot.objects.get(allocations__lease_id=lease.pk, allocations__released_at__isnull=True)
    assert fake.report(boot_id=BOOT_A).status_code == 200
    assert asked(fake) == [] and not BurnIn.objects.filter(finished_at__isnull=True).exists()

    idle = node.slots.exclude(pk=busy.pk).order_by("index")
    incident_open(slot=idle[0], starts_at=timezone.now(), reason="Xid 79", now=timezone.now())
    assert fake.report(boot_id=BOOT_B).status_code == 200      # rebooted
    pending = BurnIn.objects.filter(finished_at__isnull=True)
    assert {b.slot_id for b in pending} == {s.pk for s in idle}
    assert {b.reason for b in pending} == {BurnIn.Reason.AFTER_REBOOT}
    depths = {r["gpu"]: r["depth"] for r in asked(fake)}
    assert depths == {s.index: ("deep" if s.pk == idle[0].pk else "short") for s in idle}
    assert free_gpus(node) == 0                  # the busy card is leased, the idle ones await a pass
    assert fake.report(boot_id=BOOT_B).status_code == 200      # reported again: nothing new asked
    assert BurnIn.objects.filter(finished_at__isnull=True).count() == len(idle)


def test_a_malformed_boot_id_is_ignored_and_the_first_one_asks_nothing(catalog, gate_on, enrol):
    from fleet.models import NodeAgent
    from inventory.models import BurnIn

    node = a_node()
    fake = enrol(node)
    assert fake.report(evidence=[burn_in_record(fake, r) for r in asked(fake)]).status_code == 200
    assert fake.report(boot_id="--not a boot id--").status_code == 200
    assert NodeAgent.objects.get(node=node).boot_id == ""
    assert fake.report(boot_id=BOOT_A).status_code == 200      # first seen: enrolment's burn-in covers it
    assert NodeAgent.objects.get(node=node).boot_id == BOOT_A
    assert not BurnIn.objects.filter(slot__node=node, finished_at__isnull=True).exists()
