"""Reads shared by pages, the API and the sizing recommender. Query counts are constant:
one query for the offers, one for the nodes and their free slots (kept per generation).

The catalog rows (and the pages built from them, inventory.pagecache) are cached briefly
(settings.CATALOG_CACHE_SECONDS, off in tests) under a generation kept in the shared cache
that every stock-changing write bumps after commit (`catalog_changed`, called by the
inventory services and on saves of the catalog models); each process re-reads the
generation at most once a second. Writes that bypass both are seen within the TTL;
checkout re-checks stock under row locks anyway."""
import threading
import time
import uuid
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Exists, F, IntegerField, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from .models import GpuModel, GpuSlot, Node, Offer, Site, SlotAllocation


def open_allocation_exists():
    return Exists(SlotAllocation.objects.filter(slot=OuterRef("pk"), released_at__isnull=True))


#: A slot that may be sold: in service, no burn-in due, no health hold (inventory.burnin).
SELLABLE_SLOT = {"in_service": True, "burn_in_due": False, "health_hold": ""}


def free_slots_queryset():
    """Slots that can take a new lease right now."""
    return GpuSlot.objects.filter(
        **SELLABLE_SLOT, node__draining=False, node__site__is_active=True
    ).exclude(open_allocation_exists())


def nodes_with_free_counts(**filters):
    free_per_node = (
        free_slots_queryset()
        .filter(node=OuterRef("pk"))
        .order_by()
        .values("node")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return (
        Node.objects.filter(**filters)
        .select_related("site", "gpu_model")
        .annotate(free=Coalesce(Subquery(free_per_node, output_field=IntegerField()), 0))
    )


class NodeGroup(NamedTuple):
    """Nodes alike in everything the catalog reads of them, and how many there are."""
    site: str
    gpu_count: int
    draining: bool
    vcpus: int
    host_ram_gb: int
    free: int
    nodes: int


def node_groups(**filters) -> dict[int, list[NodeGroup]]:
    """The nodes of Node.objects.filter(**filters) with their free slots (as
    nodes_with_free_counts counts them), grouped per GPU model: building the catalog costs per
    distinct kind of node, not per node (a fleet of thousands of alike nodes is a handful of
    groups; as model instances they cost ~30 µs each, 90 ms per catalog build at 3,000 nodes).

    One statement, grouped by PostgreSQL (or SQLite): the nodes' columns joined to their free
    slots counted per node (one anti-join over the slots), so a fleet of 10,000 alike nodes
    sends back a few dozen rows, not 20,000 for Python to count (~25 ms of a web thread's
    CPU at every stock change). Counting each node's slots in a subquery of the nodes' query
    probed the slots and their allocations node by node: ~23 buffers a node, 0.4 s at 5,000
    nodes (bench/store.py --statements)."""
    nodes_sql, nodes_params = (Node.objects.filter(**filters).order_by().annotate(site_code=F("site__code"))
                               .values("id", "gpu_model_id", "site_code", "gpu_count", "draining", "vcpus",
                                       "host_ram_gb").query.sql_with_params())
    free_sql, free_params = (free_slots_queryset().order_by().values("node_id").annotate(free=Count("pk"))
                             .query.sql_with_params())
    kind = "nd.gpu_model_id, nd.site_code, nd.gpu_count, nd.draining, nd.vcpus, nd.host_ram_gb, COALESCE(fr.free, 0)"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {kind}, COUNT(*) FROM ({nodes_sql}) nd "  # noqa: S608 - the ORM's own SQL
                       f"LEFT JOIN ({free_sql}) fr ON fr.node_id = nd.id GROUP BY {kind}",
                       (*nodes_params, *free_params))
        rows = cursor.fetchall()
    groups: dict[int, list[NodeGroup]] = defaultdict(list)
    for model, site, gpu_count, draining, vcpus, ram, free, count in rows:
        groups[model].append(NodeGroup(site, gpu_count, bool(draining), vcpus, ram, free, count))
    return groups


def _units_free(offer: Offer, groups: list[NodeGroup]) -> dict[str, int]:
    """How many of the offer the model's nodes (`groups`) can still host, per site: its GPUs
    must sit on one node, and a draining node takes no new lease."""
    free: dict[str, int] = defaultdict(int)
    for g in groups:
        if g.gpu_count >= offer.gpu_count and not g.draining and (units := g.free // offer.gpu_count):
            free[g.site] += units * g.nodes
    return dict(free)


@dataclass
class OfferRow:
    offer: Offer
    free_by_site: dict[str, int] = field(default_factory=dict)
    vcpus: int | None = None
    ram_gb: int | None = None

    @property
    def disk_gb(self) -> int:
        return self.gpu.included_nvme_gb

    @property
    def total_vram_gb(self) -> int:
        return self.gpu.vram_gb * self.offer.gpu_count

    @property
    def free_total(self) -> int:
        return sum(self.free_by_site.values())

    @property
    def gpu(self) -> GpuModel:
        return self.offer.gpu_model


@dataclass(frozen=True)
class CatalogFilter:
    min_vram_gb: int | None = None
    vendor: str | None = None
    interconnect: str | None = None
    site: str | None = None
    max_monthly_cents: int | None = None
    in_stock: bool = False
    sort: str = ""


# Sort keys of the catalog table (a "-" prefix in the query string reverses).
SORT_KEYS = {
    "price": lambda row: row.offer.monthly_cents,
    "vram": lambda row: row.total_vram_gb,
    "per_gb": lambda row: row.offer.per_vram_gb_month_cents,
    "free": lambda row: row.free_total,
}


def _node_share(offer: Offer, groups: list[NodeGroup], attr: str) -> int | None:
    """The smallest share of `attr` (vcpus, host_ram_gb) an instance of the offer gets on
    any node of its model (`groups`: that model's): what the customer can count on."""
    shares = [getattr(g, attr) * offer.gpu_count // g.gpu_count for g in groups if g.gpu_count >= offer.gpu_count]
    return min(shares) if shares else None


CATALOG_GENERATION_KEY = "inventory:catalog:generation"
_MEMO: "OrderedDict[tuple, tuple[str, float, object]]" = OrderedDict()
_MEMO_MAX = 512  # entries per process; filters come from the query string, so bound them
_MEMO_LOCK = threading.Lock()


GENERATION_LOCAL_SECONDS = 1.0  # how long a process trusts the generation it last read
_generation_seen: list = [None, 0.0]  # [generation, read until (monotonic)]


def catalog_changed() -> None:
    """Stock, prices or sites changed: values built at older generations are stale."""
    generation = uuid.uuid4().hex
    cache.set(CATALOG_GENERATION_KEY, generation, None)
    _generation_seen[:] = [None, 0.0]  # this process re-reads at once; others within 1 s


def catalog_generation() -> str | None:
    """The current generation from the shared cache (re-read at most once a second per
    process), None without a working cache."""
    generation, until = _generation_seen
    if generation is not None and until > time.monotonic():
        return generation
    generation = cache.get(CATALOG_GENERATION_KEY)
    if generation is None:
        cache.add(CATALOG_GENERATION_KEY, uuid.uuid4().hex, None)
        generation = cache.get(CATALOG_GENERATION_KEY)
    _generation_seen[:] = [generation, time.monotonic() + GENERATION_LOCAL_SECONDS]
    return generation


def cached_by_generation(name: str, parts, build, *, generation: str | None = None):
    """build(), kept in this process for CATALOG_CACHE_SECONDS while the shared catalog
    generation is unchanged: a hit costs one small cache read (the generation), no
    unpickling. A cache that fails (Redis down, see core.cache) means building again."""
    seconds = getattr(settings, "CATALOG_CACHE_SECONDS", 0)
    if seconds <= 0:
        return build()
    generation = generation or catalog_generation()
    if generation is None:
        return build()
    key, now = (name, parts), time.monotonic()
    with _MEMO_LOCK:
        hit = _MEMO.get(key)
        if hit is not None and hit[0] == generation and hit[1] > now:
            _MEMO.move_to_end(key)
            return hit[2]
    value = build()
    with _MEMO_LOCK:
        _MEMO[key] = (generation, now + seconds, value)
        _MEMO.move_to_end(key)
        while len(_MEMO) > _MEMO_MAX:
            _MEMO.popitem(last=False)
    return value


def catalog_rows(flt: CatalogFilter | None = None) -> list[OfferRow]:
    """Active offers with free units per site, filtered; cheapest monthly first within a model."""
    flt = flt or CatalogFilter()
    return cached_by_generation("rows", flt, lambda: _catalog_rows(flt))


def _catalog_rows(flt: CatalogFilter) -> list[OfferRow]:
    offers = Offer.objects.filter(is_active=True).select_related("gpu_model__interconnect")
    if flt.min_vram_gb:
        offers = offers.filter(gpu_model__vram_gb__gte=flt.min_vram_gb)
    if flt.vendor:
        offers = offers.filter(gpu_model__vendor=flt.vendor)
    if flt.interconnect:
        offers = offers.filter(gpu_model__interconnect__slug=flt.interconnect)
    if flt.max_monthly_cents:
        offers = offers.filter(monthly_cents__lte=flt.max_monthly_cents)
    offers = list(offers)
    groups = active_node_groups()
    rows = []
    for offer in offers:
        alike = groups.get(offer.gpu_model_id, [])
        if flt.site:
            alike = [g for g in alike if g.site == flt.site]
        row = OfferRow(offer=offer, free_by_site=_units_free(offer, alike),
                       vcpus=offer.vcpus or _node_share(offer, alike, "vcpus"),
                       ram_gb=offer.ram_gb or _node_share(offer, alike, "host_ram_gb"))
        if not flt.in_stock or row.free_total:
            rows.append(row)
    return _sorted(rows, flt.sort)


def _sorted(rows: list[OfferRow], sort: str) -> list[OfferRow]:
    key = SORT_KEYS.get(sort.lstrip("-"))
    return sorted(rows, key=key, reverse=sort.startswith("-")) if key else rows


def free_gpus_by_model_and_site() -> dict[tuple[int, str], int]:
    """GPUs (not offers) free per (gpu_model_id, site code): the catalog's headline counts."""
    counts = (
        free_slots_queryset()
        .values("node__gpu_model_id", "node__site__code")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return {(c["node__gpu_model_id"], c["node__site__code"]): c["n"] for c in counts}


def active_sites():
    return Site.objects.filter(is_active=True)


def sites_with_stock_for(offer: Offer) -> dict[str, int]:
    return _units_free(offer, active_node_groups().get(offer.gpu_model_id, []))


def active_node_groups() -> dict[int, list[NodeGroup]]:
    """node_groups() of every active site, kept per generation: one build per stock change
    in a process, whatever the filters of the catalog rows built from it."""
    return cached_by_generation("node-groups", None, lambda: node_groups(site__is_active=True))


def sizing_candidates(site: str | None = None) -> list:
    """The live catalog as the sizing recommender's candidates (sizing never imports us)."""
    return cached_by_generation("sizing-candidates", site, lambda: _sizing_candidates(site))


def _sizing_candidates(site: str | None) -> list:
    from sizing.recommend import Candidate

    rows = _catalog_rows(CatalogFilter(site=site))
    no_nvlink = _models_without_reported_nvlink()
    return [
        Candidate(
            offer_slug=row.offer.slug,
            offer_name=row.offer.display_name,
            gpu_name=row.gpu.name,
            vendor=row.gpu.vendor,
            gpus=row.offer.gpu_count,
            vram_gb=row.gpu.vram_gb,
            link=reported_link(row.gpu.interconnect.sharding, row.gpu.pk in no_nvlink),
            weekly_cents=row.offer.weekly_cents,
            monthly_cents=row.offer.monthly_cents,
            bf16_tflops=float(row.gpu.bf16_tflops),
            free_by_site=row.free_by_site,
            host_ram_gb=row.ram_gb,
        )
        for row in rows
    ]


NVLINK_LINKS = ("nvswitch", "nvlink_bridge")


def reported_link(catalog_link: str, nodes_see_no_nvlink: bool) -> str:
    """The recommendation's link rule trusts the node agents: an NVLink card whose nodes
    all report no NVLink between the cards is sharded as PCIe."""
    return "pcie" if catalog_link in NVLINK_LINKS and nodes_see_no_nvlink else catalog_link


def _models_without_reported_nvlink() -> set[int]:
    """GPU models whose nodes reported their links, every one without NVLink."""
    seen: dict[int, bool] = {}
    for model_id, ok in Node.objects.filter(nvlink_reported__isnull=False).order_by().values_list(
            "gpu_model_id", "nvlink_reported").distinct():       # at most two rows a model, not one a node
        seen[model_id] = seen.get(model_id, False) or ok
    return {model_id for model_id, any_ok in seen.items() if not any_ok}


def gpu_models_with_offers():
    return GpuModel.objects.select_related("interconnect").prefetch_related(
        "offers"
    ).filter(Q(offers__is_active=True)).distinct()
