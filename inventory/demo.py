"""The demo catalog: SPEC.md's first document (USD), loaded idempotently.

Free counts come out equal to SPEC.md's "free now" column because the loader creates
exactly that many in-service slots; nodes are spread round-robin over the three sites.
The RTX 4090 and A40 have no published count: the demo gives them 40 and 32.
The 8× H100 HGX node's weekly price is not published; it uses the ratio the other
multi-GPU offers share (week ≈ 1.21 × month × 7/30).
"""
from dataclasses import dataclass

from django.db import transaction
from django.utils.translation import gettext_noop  # demo texts: the pages translate them when known

from .models import GpuModel, GpuSlot, Interconnect, Node, Offer, Site, StorageProduct
from .selectors import catalog_changed

SITES = [("DFW-1", "Dallas"), ("IAD-1", "Ashburn"), ("PDX-1", "Hillsboro")]

# slug, cards, link, bandwidth, sharding
INTERCONNECTS = [
    ("nvlink5-nvswitch", gettext_noop("B200 (2, 4 or 8-way)"), "NVLink 5 + NVSwitch", "1.8 TB/s", "nvswitch"),
    ("nvlink-nvswitch-900", "H100 SXM, H200 SXM", "NVLink + NVSwitch", "900 GB/s", "nvswitch"),
    ("nvlink-nvswitch-600", "A100 SXM", "NVLink + NVSwitch", "600 GB/s", "nvswitch"),
    ("infinity-fabric", "MI300X", "Infinity Fabric", "896 GB/s", "infinity_fabric"),
    ("nvlink-bridge-600", "H100 PCIe", gettext_noop("optional NVLink bridge"), "600 GB/s", "nvlink_bridge"),
    ("nvlink-bridge-112", "A6000, A40, 3090, A5000", gettext_noop("NVLink bridge"), "112 GB/s", "nvlink_bridge"),
    ("pcie-p2p", "L40S, RTX 6000 Ada, L4", gettext_noop("PCIe Gen4 peer-to-peer"), "~32 GB/s", "pcie_p2p"),
    ("pcie", "RTX 4090, RTX 5090", gettext_noop("PCIe, no NVLink"), "~32 / ~63 GB/s (Gen4 / Gen5 x16)", "pcie"),
]


@dataclass(frozen=True)
class DemoGpu:
    slug: str
    name: str
    vendor: str
    vram_gb: int
    memory_type: str
    bandwidth: int | None
    interconnect: str
    link: str
    fp8: bool
    tflops: int
    nvme_gb: int
    week: int  # USD cents
    month: int
    free: int
    node_size: int
    vcpus_per_gpu: int
    ram_per_gpu: int
    notes: str = ""


GPUS = [
    DemoGpu("h100-sxm", "H100 SXM", "nvidia", 80, "HBM3", 3350, "nvlink-nvswitch-900",
            "NVLink 900 GB/s", True, 989, 2000, 47500, 169000, 63, 8, 20, 200, gettext_noop("preferred; FP8")),
    DemoGpu("a100-sxm", "A100 SXM", "nvidia", 80, "HBM2e", 2040, "nvlink-nvswitch-600",
            "NVLink 600 GB/s", False, 312, 1000, 28000, 99000, 78, 8, 16, 128, gettext_noop("no FP8")),
    DemoGpu("h200-sxm", "H200 SXM", "nvidia", 141, "HBM3e", 4800, "nvlink-nvswitch-900",
            "NVLink 900 GB/s", True, 989, 2000, 64000, 229000, 19, 8, 20, 240),
    DemoGpu("mi300x", "MI300X", "amd", 192, "HBM3", 5300, "infinity-fabric",
            "Infinity Fabric 896 GB/s", True, 1307, 2000, 45000, 159000, 8, 8, 24, 256, "ROCm 6.4"),
    DemoGpu("l40s", "L40S", "nvidia", 48, "GDDR6 ECC", 864, "pcie-p2p",
            gettext_noop("PCIe Gen4 peer-to-peer"), True, 362, 500, 14800, 52000, 74, 8, 12, 96),
    DemoGpu("rtx-a6000", "RTX A6000", "nvidia", 48, "GDDR6 ECC", 768, "nvlink-bridge-112",
            gettext_noop("NVLink bridge 112 GB/s, pairs"), False, 155, 500, 8200, 29000, 65, 4, 12, 96),
    DemoGpu("rtx-3090", "RTX 3090", "nvidia", 24, "GDDR6X", 936, "nvlink-bridge-112",
            gettext_noop("NVLink bridge 112 GB/s, pairs"), False, 71, 500, 6500, 23000, 186, 8, 8, 64),
    DemoGpu("rtx-a5000", "RTX A5000", "nvidia", 24, "GDDR6 ECC", 768, "nvlink-bridge-112",
            gettext_noop("NVLink bridge 112 GB/s, pairs"), False, 111, 500, 5500, 19000, 51, 4, 8, 64, "230 W"),
    DemoGpu("rtx-4090", "RTX 4090", "nvidia", 24, "GDDR6X", 1008, "pcie",
            gettext_noop("PCIe, no NVLink"), True, 165, 500, 11000, 39000, 40, 8, 8, 64),
    DemoGpu("a40", "A40", "nvidia", 48, "GDDR6 ECC", 696, "nvlink-bridge-112",
            gettext_noop("NVLink bridge 112 GB/s, pairs"), False, 150, 500, 6800, 24000, 32, 4, 12, 96),
]

# gpu slug, count, weekly cents, monthly cents, note
MULTI_GPU_OFFERS = [
    ("a100-sxm", 2, 53200, 188100, "NVLink 600 GB/s"),
    ("mi300x", 8, 324000, 1145000, "Infinity Fabric"),
    ("h100-sxm", 8, 344000, 1217000, gettext_noop("HGX node with NVSwitch")),
]

STORAGE = [
    ("extra_nvme", 900, 0, 30, gettext_noop("Extra local NVMe on the same host, encrypted")),
    ("network_volume", 1400, 0, None,
     gettext_noop("Three replicas in the region, attachable to several instances, survives release")),
    ("snapshot", 600, 0, None,
     gettext_noop("Restorable to any instance in the region — move a run from A100 to H100 without re-uploading")),
    ("egress", 400, 20, None, gettext_noop("20 TB per instance-month included, then $4 per TB")),
]


# Each table's rows as (natural key, the other fields): one place for both ways of loading them.
def _site_rows() -> list[tuple[dict, dict]]:
    return [({"code": code}, {"name": city}) for code, city in SITES]


def _interconnect_rows() -> list[tuple[dict, dict]]:
    return [({"slug": slug}, {"cards": cards, "link": link, "bandwidth": bandwidth, "sharding": sharding, "sort": sort})
            for sort, (slug, cards, link, bandwidth, sharding) in enumerate(INTERCONNECTS)]


def _gpu_model_rows(interconnects: dict[str, Interconnect]) -> list[tuple[dict, dict]]:
    return [({"slug": g.slug}, {
        "name": g.name, "vendor": g.vendor, "vram_gb": g.vram_gb, "memory_type": g.memory_type,
        "memory_bandwidth_gbps": g.bandwidth, "link_description": g.link, "fp8": g.fp8,
        "bf16_tflops": g.tflops, "included_nvme_gb": g.nvme_gb, "notes": g.notes, "sort": sort,
        "interconnect": interconnects[g.interconnect]}) for sort, g in enumerate(GPUS)]


def _offer_rows(models: dict[str, GpuModel]) -> list[tuple[dict, dict]]:
    """The single-card offers in GPUS' order, then the multi-GPU ones."""
    single = [({"slug": g.slug}, {"gpu_model": models[g.slug], "weekly_cents": g.week, "monthly_cents": g.month})
              for g in GPUS]
    multi = [({"slug": f"{count}x-{gpu_slug}"}, {
        "gpu_model": models[gpu_slug], "gpu_count": count, "weekly_cents": week, "monthly_cents": month,
        "link_note": note}) for gpu_slug, count, week, month, note in MULTI_GPU_OFFERS]
    return single + multi


def _storage_rows() -> list[tuple[dict, dict]]:
    return [({"kind": kind}, {"cents_per_tb_month": cents, "included_tb": included, "max_tb": max_tb,
                              "description": description})
            for kind, cents, included, max_tb, description in STORAGE]


def _upsert_catalog() -> None:
    """A catalog already there: its sites, links, cards and storage are brought back to the
    demo's figures; an offer that exists keeps its prices (an operator may have changed them)."""
    for key, fields in _site_rows():
        Site.objects.update_or_create(**key, defaults=fields)
    for key, fields in _interconnect_rows():
        Interconnect.objects.update_or_create(**key, defaults=fields)
    for key, fields in _gpu_model_rows({i.slug: i for i in Interconnect.objects.all()}):
        GpuModel.objects.update_or_create(**key, defaults=fields)
    for key, fields in _offer_rows({m.slug: m for m in GpuModel.objects.all()}):
        Offer.objects.get_or_create(**key, defaults=fields)
    for key, fields in _storage_rows():
        StorageProduct.objects.update_or_create(**key, defaults=fields)


def _node_sizes(free: int, node_size: int) -> list[int]:
    full, rest = divmod(free, node_size)
    return [node_size] * full + ([rest] if rest else [])


def _node_rows(sites: list[Site], models: dict[str, GpuModel]) -> list[Node]:
    """The demo nodes, in GPUS' order, spread round-robin over the sites (by code)."""
    return [Node(site=sites[i % len(sites)], name=f"{sites[i % len(sites)].code.lower()}-{g.slug}-{i + 1:02d}",
                 gpu_model=models[g.slug], gpu_count=size, vcpus=g.vcpus_per_gpu * size,
                 host_ram_gb=g.ram_per_gpu * size)
            for g in GPUS for i, size in enumerate(_node_sizes(g.free, g.node_size))]


def _create_nodes() -> int:
    """Create the demo nodes once; a catalog that already has nodes is left alone."""
    if Node.objects.exists():
        return 0
    nodes = Node.objects.bulk_create(_node_rows(list(Site.objects.order_by("code")),
                                                {m.slug: m for m in GpuModel.objects.all()}))
    GpuSlot.objects.bulk_create([GpuSlot(node=node, index=k) for node in nodes for k in range(node.gpu_count)])
    transaction.on_commit(catalog_changed)  # bulk_create sends no post_save (inventory.apps)
    return len(nodes)


def _catalog_is_empty() -> bool:
    return not any(model.objects.exists() for model in (Site, Interconnect, GpuModel, Offer, StorageProduct, Node))


def _create_catalog() -> int:
    """An empty catalog (a new database; each test's): every table in one INSERT, where the
    upserts took ~650 queries (0.2 s on SQLite, more on a busy PostgreSQL). The rows, their
    order and so their ids are the upserts' (tests/inventory/test_demo.py)."""
    Site.objects.bulk_create([Site(**key, **fields) for key, fields in _site_rows()])
    interconnects = Interconnect.objects.bulk_create(
        [Interconnect(**key, **fields) for key, fields in _interconnect_rows()])
    models = GpuModel.objects.bulk_create(
        [GpuModel(**key, **fields) for key, fields in _gpu_model_rows({i.slug: i for i in interconnects})])
    Offer.objects.bulk_create([Offer(**key, **fields) for key, fields in _offer_rows({m.slug: m for m in models})])
    StorageProduct.objects.bulk_create([StorageProduct(**key, **fields) for key, fields in _storage_rows()])
    return _create_nodes()


@transaction.atomic
def load_demo_catalog() -> int:
    """Returns how many nodes were created (0 on a second run)."""
    if _catalog_is_empty():
        return _create_catalog()
    _upsert_catalog()
    return _create_nodes()
