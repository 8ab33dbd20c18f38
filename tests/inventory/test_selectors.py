"""inventory/selectors.py: the node groups the catalog and the recommender are built from,
counted and grouped in one statement, against the definition of a free slot (nodes_with_free_counts,
each node's slots counted in a subquery); and kept once per generation whatever the filters."""
from collections import Counter, defaultdict

import pytest
from django.db import transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory import selectors
from inventory.models import GpuSlot, Node, Site, SlotAllocation
from inventory.selectors import CatalogFilter, node_groups, nodes_with_free_counts


def by_definition(**filters) -> dict[int, Counter]:
    """Per GPU model, its nodes' (site, gpu_count, draining, vcpus, RAM, free slots), counted,
    from each node's free slots as nodes_with_free_counts counts them."""
    groups: dict[int, Counter] = defaultdict(Counter)
    for node in nodes_with_free_counts(**filters):
        groups[node.gpu_model_id][(node.site.code, node.gpu_count, node.draining, node.vcpus, node.host_ram_gb,
                                   node.free)] += 1
    return dict(groups)


def as_counted(groups) -> dict[int, Counter]:
    return {model: Counter({tuple(g[:-1]): g.nodes for g in kinds}) for model, kinds in groups.items()}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_groups_count_every_nodes_free_slots_as_the_definition_does(catalog, data):
    """Random stock: slots held and released, out of service, in burn-in, on hold; nodes
    draining; a site closed. Each example runs in a savepoint rolled back after it."""
    with transaction.atomic():
        nodes = list(Node.objects.order_by("pk"))
        slots = list(GpuSlot.objects.order_by("pk"))
        held = data.draw(st.lists(st.sampled_from(slots), max_size=40, unique_by=lambda s: s.pk), label="held")
        released = data.draw(st.lists(st.booleans(), min_size=len(held), max_size=len(held)), label="released")
        SlotAllocation.objects.bulk_create(
            SlotAllocation(slot=slot, lease_id=10**6 + slot.pk, released_at=timezone.now() if gone else None)
            for slot, gone in zip(held, released, strict=True))
        for slot in data.draw(st.lists(st.sampled_from(slots), max_size=10, unique_by=lambda s: s.pk), label="unsold"):
            change = data.draw(st.sampled_from([{"in_service": False}, {"burn_in_due": True},
                                                {"health_hold": "xid"}]), label="why")
            GpuSlot.objects.filter(pk=slot.pk).update(**change)
        draining = data.draw(st.lists(st.sampled_from(nodes), max_size=8, unique_by=lambda n: n.pk), label="draining")
        Node.objects.filter(pk__in=[n.pk for n in draining]).update(draining=True)
        if data.draw(st.booleans(), label="a site closed"):
            Site.objects.filter(pk=data.draw(st.sampled_from(list(Site.objects.values_list("pk", flat=True))))
                                ).update(is_active=False)
        model = data.draw(st.sampled_from(sorted({n.gpu_model_id for n in nodes})), label="model")
        for filters in ({"site__is_active": True}, {"gpu_model": model}, {}):
            assert as_counted(node_groups(**filters)) == by_definition(**filters), filters
        transaction.set_rollback(True)


def test_the_groups_are_one_statement_grouped_by_the_database(catalog):
    """One query whatever the fleet, without a subquery per node, whose answer is a row per
    kind of node: twenty more nodes alike in everything add no row."""
    with CaptureQueriesContext(transaction.get_connection()) as queries:
        before = node_groups(site__is_active=True)
    assert len(queries) == 1
    assert not any("(SELECT COUNT" in q["sql"].upper() for q in queries.captured_queries)
    template = Node.objects.filter(site__is_active=True).order_by("pk").first()
    with transaction.atomic():
        for i in range(20):
            node = Node.objects.create(site=template.site, name=f"alike-{i}", gpu_model=template.gpu_model,
                                       gpu_count=template.gpu_count, vcpus=template.vcpus,
                                       host_ram_gb=template.host_ram_gb)
            GpuSlot.objects.bulk_create(GpuSlot(node=node, index=k) for k in range(template.gpu_count))
        after = node_groups(site__is_active=True)
        transaction.set_rollback(True)
    assert sum(map(len, after.values())) <= sum(map(len, before.values())) + 1
    assert sum(g.nodes for g in after[template.gpu_model_id]) == \
        sum(g.nodes for g in before[template.gpu_model_id]) + 20


@pytest.fixture
def kept(settings, monkeypatch):
    """The catalog kept per generation as production keeps it, this test's memo only."""
    settings.CATALOG_CACHE_SECONDS = 600
    monkeypatch.setattr(selectors, "_MEMO", type(selectors._MEMO)())
    selectors.catalog_changed()


def test_the_node_groups_are_built_once_per_generation_whatever_the_filters(catalog, kept):
    with CaptureQueriesContext(transaction.get_connection()) as queries:
        for flt in (CatalogFilter(), CatalogFilter(site="DFW-1"), CatalogFilter(vendor="amd"),
                    CatalogFilter(in_stock=True, sort="price")):
            selectors.catalog_rows(flt)
        selectors.sizing_candidates("IAD-1")
    reads_of_nodes = [q for q in queries.captured_queries if '"inventory_gpuslot"' in q["sql"]]
    assert len(reads_of_nodes) == 1
    selectors.catalog_changed()                   # stock moved: built again, once
    with CaptureQueriesContext(transaction.get_connection()) as queries:
        selectors.catalog_rows(CatalogFilter(site="PDX-1"))
        selectors.catalog_rows(CatalogFilter())
    assert len([q for q in queries.captured_queries if '"inventory_gpuslot"' in q["sql"]]) == 1


def test_a_sites_rows_count_only_that_sites_nodes(catalog):
    everywhere = {row.offer.slug: row.free_by_site for row in selectors.catalog_rows(CatalogFilter())}
    for row in selectors.catalog_rows(CatalogFilter(site="DFW-1")):
        assert row.free_by_site == {s: n for s, n in everywhere[row.offer.slug].items() if s == "DFW-1"}
