import pytest
from django.urls import reverse

from inventory.demo import GPUS, load_demo_catalog
from inventory.models import GpuModel, Node, Offer, Site, SlotAllocation
from inventory.selectors import CatalogFilter, catalog_rows, free_gpus_by_model_and_site
from inventory.services import SoldOut, node_set_draining, slots_allocate, slots_release

SPEC_FREE = {"h100-sxm": 63, "a100-sxm": 78, "h200-sxm": 19, "mi300x": 8, "l40s": 74,
             "rtx-a6000": 65, "rtx-3090": 186, "rtx-a5000": 51}


def free_by_model() -> dict[str, int]:
    slugs = dict(GpuModel.objects.values_list("id", "slug"))
    totals: dict[str, int] = {}
    for (model_id, _site), n in free_gpus_by_model_and_site().items():
        totals[slugs[model_id]] = totals.get(slugs[model_id], 0) + n
    return totals


def test_demo_free_counts_equal_spec_and_spread_over_three_sites(catalog):
    free = free_by_model()
    for slug, n in SPEC_FREE.items():
        assert free[slug] == n, slug
    sites_used = set(Node.objects.values_list("site__code", flat=True))
    assert sites_used == {"DFW-1", "IAD-1", "PDX-1"}


def test_loading_twice_does_not_duplicate(catalog):
    counts = (Node.objects.count(), Offer.objects.count(), Site.objects.count())
    assert load_demo_catalog() == 0
    assert (Node.objects.count(), Offer.objects.count(), Site.objects.count()) == counts


def test_prices_are_spec_cents_and_per_gpu_hour_is_monthly_over_720(catalog):
    h100 = Offer.objects.get(slug="h100-sxm")
    assert (h100.weekly_cents, h100.monthly_cents, h100.per_gpu_hour_cents) == (47500, 169000, 235)
    pair = Offer.objects.get(slug="2x-a100-sxm")
    assert (pair.monthly_cents, pair.per_gpu_hour_cents) == (188100, 131)
    assert Offer.objects.get(slug="8x-mi300x").per_gpu_hour_cents == 199
    assert {g.slug for g in GPUS} == set(GpuModel.objects.values_list("slug", flat=True))


def test_free_count_drops_when_slot_taken_and_returns_when_released(catalog):
    offer, site = Offer.objects.get(slug="h200-sxm"), Site.objects.get(code="DFW-1")
    before = free_by_model()["h200-sxm"]
    slots = slots_allocate(offer=offer, site=site, lease_id=101)
    assert len(slots) == 1
    assert free_by_model()["h200-sxm"] == before - 1
    assert slots_release(lease_id=101) == 1
    assert slots_release(lease_id=101) == 0  # idempotent
    assert free_by_model()["h200-sxm"] == before


def test_multi_gpu_offer_takes_slots_on_one_node_and_sells_out(catalog):
    offer = Offer.objects.get(slug="8x-mi300x")
    site = Node.objects.get(gpu_model__slug="mi300x").site
    slots = slots_allocate(offer=offer, site=site, lease_id=7)
    assert len({s.node_id for s in slots}) == 1 and len(slots) == 8
    with pytest.raises(SoldOut):
        slots_allocate(offer=offer, site=site, lease_id=8)
    row = next(r for r in catalog_rows() if r.offer.slug == "8x-mi300x")
    assert row.free_total == 0
    # Released, the same eight cards sell again.
    slots_release(lease_id=7)
    assert sorted(s.pk for s in slots_allocate(offer=offer, site=site, lease_id=9)) == sorted(s.pk for s in slots)


def test_one_slot_one_live_lease_at_database_level(catalog):
    from django.db import IntegrityError, transaction

    slot = Node.objects.first().slots.first()
    SlotAllocation.objects.create(slot=slot, lease_id=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        SlotAllocation.objects.create(slot=slot, lease_id=2)


def test_draining_node_leaves_stock_and_is_audited(catalog, operator):
    node = Node.objects.filter(gpu_model__slug="mi300x").get()
    node_set_draining(node=node, draining=True, actor=operator, reason="maintenance")
    assert free_by_model().get("mi300x", 0) == 0
    from inventory.models import AuditEntry

    entry = AuditEntry.objects.get(action="node_drain")
    assert entry.actor == operator and entry.detail["reason"] == "maintenance"


@pytest.mark.parametrize("unsellable", [{"in_service": False}, {"burn_in_due": True}, {"health_hold": "xid_79"}])
def test_a_card_out_of_service_in_burn_in_or_on_hold_is_not_sold(catalog, unsellable):
    """The allocator sells only sellable cards: one of the eight mi300x cards out of service,
    due a burn-in or held by a health condition, the 8-card offer is sold out and a 1-card
    order gets one of the other seven."""
    node = Node.objects.get(gpu_model__slug="mi300x")
    held = node.slots.get(index=0)
    node.slots.filter(pk=held.pk).update(**unsellable)
    with pytest.raises(SoldOut):
        slots_allocate(offer=Offer.objects.get(slug="8x-mi300x"), site=node.site, lease_id=41)
    taken = [slots_allocate(offer=Offer.objects.get(slug="mi300x"), site=node.site, lease_id=42 + i)[0].pk
             for i in range(7)]
    assert held.pk not in taken and len(set(taken)) == 7
    with pytest.raises(SoldOut):
        slots_allocate(offer=Offer.objects.get(slug="mi300x"), site=node.site, lease_id=49)


def test_a_draining_node_is_sold_no_new_lease(catalog, operator):
    """Draining stops new leases on a node: the allocator itself refuses it, not only the
    catalog's count (the one mi300x node drained: sold out; undrained: its card sells)."""
    node = Node.objects.get(gpu_model__slug="mi300x")
    offer = Offer.objects.get(slug="mi300x")
    node_set_draining(node=node, draining=True, actor=operator, reason="maintenance")
    with pytest.raises(SoldOut):
        slots_allocate(offer=offer, site=node.site, lease_id=31)
    node_set_draining(node=node, draining=False, actor=operator)
    assert [s.node_id for s in slots_allocate(offer=offer, site=node.site, lease_id=31)] == [node.pk]


def test_draining_twice_is_one_change_and_undraining_returns_the_stock(catalog, operator):
    """Only a change is audited: asking to drain a draining node changes nothing. Undraining
    puts the node's cards back in stock and is audited as such (no reason given: none recorded)."""
    from inventory.models import AuditEntry

    node = Node.objects.filter(gpu_model__slug="mi300x").get()
    free = free_by_model()["mi300x"]
    node_set_draining(node=node, draining=True, actor=operator, reason="maintenance")
    node_set_draining(node=node, draining=True, actor=operator, reason="maintenance")
    assert AuditEntry.objects.filter(action="node_drain").count() == 1
    assert node_set_draining(node=node, draining=False, actor=operator).draining is False
    assert free_by_model()["mi300x"] == free
    entry = AuditEntry.objects.get(action="node_undrain")
    assert entry.actor == operator and entry.detail == {"reason": ""}


def test_filters_select_rows(catalog):
    big = catalog_rows(CatalogFilter(min_vram_gb=100))
    assert {r.gpu.slug for r in big} == {"h200-sxm", "mi300x"}
    amd = catalog_rows(CatalogFilter(vendor="amd"))
    assert {r.offer.slug for r in amd} == {"mi300x", "8x-mi300x"}
    cheap = catalog_rows(CatalogFilter(max_monthly_cents=25000))
    assert {r.offer.slug for r in cheap} == {"rtx-3090", "rtx-a5000", "a40"}
    dfw = catalog_rows(CatalogFilter(site="DFW-1", in_stock=True))
    assert all(set(r.free_by_site) == {"DFW-1"} for r in dfw)


@pytest.mark.parametrize(
    "query,field",
    [("min_vram=lots", "Min VRAM"), ("vendor=intel", "Vendor"), ("max_price=-5", "Max $/month"),
     ("site=MARS-1", "Site"), ("min_vram=99999999999999999999", "Min VRAM")],
)
def test_bad_filter_input_gives_clear_400(client, catalog, query, field):
    response = client.get(reverse("catalog") + "?" + query)
    assert response.status_code == 400
    body = response.content.decode()
    assert "not valid" in body and field in body


def test_catalog_page_lists_every_spec_gpu_with_price_and_free_per_site(client, catalog):
    body = client.get(reverse("catalog")).content.decode()
    for gpu in GPUS:
        assert gpu.name in body
    assert "$1,690" in body and "$2.35" in body and "$12,170" in body
    for code in ("DFW-1", "IAD-1", "PDX-1"):
        assert code in body


def test_catalog_htmx_returns_only_the_table(client, catalog):
    response = client.get(reverse("catalog") + "?vendor=amd", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body and "MI300X" in body and "H100" not in body


@pytest.mark.parametrize("name,args", [("home", []), ("catalog", []), ("gpu_detail", ["h100-sxm"]),
                                       ("links", []), ("storage", []), ("faq", []), ("signup", []),
                                       ("login", []), ("healthz", [])])
def test_every_page_renders(client, catalog, name, args):
    assert client.get(reverse(name, args=args)).status_code == 200


def test_home_headline_range_comes_from_live_prices(client, catalog):
    body = client.get(reverse("home")).content.decode()
    assert "$190/month for a 24 GB card" in body and "$12,170/month" in body


def test_unknown_gpu_is_404(client, catalog):
    assert client.get(reverse("gpu_detail", args=["voodoo-5"])).status_code == 404


def test_faq_figures_come_from_the_sizing_engine(client, catalog):
    from sizing.figures import faq_vram_figures

    figures = faq_vram_figures()
    body = client.get(reverse("faq")).content.decode()
    assert f"about {figures['q7']} GB" in body and f"about {figures['l70']} GB" in body
    assert 8 <= figures["q7"] <= 12 and figures["l70"] > 150  # SPEC: ~10 GB, 156 GB
    assert "$190/month" in body  # the A5000's live price


def test_catalog_rows_link_to_the_order_page(client, catalog):
    body = client.get(reverse("catalog")).content.decode()
    assert reverse("order", args=["h100-sxm"]) in body


def test_a_nodes_slots_follow_its_gpu_count_but_a_used_slot_stays(catalog, operator):
    """node_save: a new node gets slots 0…n-1; lowering its count removes the unused slots
    beyond it; a slot any lease ever held is never removed: the change is refused, saying
    why, and none of it is saved. Every saved change is audited with old and new values."""
    from django.utils import timezone

    from inventory.models import AuditEntry
    from inventory.services import NodeRefused, node_save

    def indexes():
        return sorted(node.slots.values_list("index", flat=True))

    node = Node(site=Site.objects.get(code="DFW-1"), name="dfw-test-9", gpu_model=GpuModel.objects.get(slug="rtx-3090"),
                gpu_count=4, vcpus=32, host_ram_gb=128)
    node_save(node=node, actor=operator, changed={})
    assert indexes() == [0, 1, 2, 3]
    node.gpu_count = 3
    node_save(node=node, actor=operator, changed={"gpu_count": (4, 3)})
    assert indexes() == [0, 1, 2]
    SlotAllocation.objects.create(slot=node.slots.get(index=2), lease_id=9, released_at=timezone.now())
    node.gpu_count = 2
    with pytest.raises(NodeRefused) as refused:
        node_save(node=node, actor=operator, changed={"gpu_count": (3, 2)})
    assert str(refused.value) == ("dfw-test-9: slots at index 2 and above have leases; "
                                  "drain the node and let them end first")
    assert Node.objects.get(pk=node.pk).gpu_count == 3 and indexes() == [0, 1, 2]
    audited = AuditEntry.objects.filter(action__in=["node_created", "node_changed"], actor=operator).order_by("id")
    assert [(e.action, e.detail) for e in audited] == [("node_created", {}),
                                                      ("node_changed", {"gpu_count": ["4", "3"]})]
