"""The catalog a buyer compares with: sortable columns (links, no JS needed), price per GB
of VRAM, each offer's vCPU / RAM / NVMe / network, single cards and whole nodes told apart,
and only the link types that are actually sold in the filter."""
import re

from django.urls import reverse

from inventory.forms import CatalogFilterForm
from inventory.models import GpuModel, Interconnect, Node, Offer
from inventory.selectors import CatalogFilter, catalog_rows


def _offer_order(html: str) -> list[str]:
    return re.findall(r'href="/gpus/[^/]+/">([^<]+)</a>', html)


def test_sorting_by_price_and_per_gb_orders_rows_both_ways(catalog):
    cheap_first = [r.offer.monthly_cents for r in catalog_rows(CatalogFilter(sort="price"))]
    assert cheap_first == sorted(cheap_first)
    dear_first = [r.offer.monthly_cents for r in catalog_rows(CatalogFilter(sort="-price"))]
    assert dear_first == sorted(dear_first, reverse=True)
    per_gb = [r.offer.per_vram_gb_month_cents for r in catalog_rows(CatalogFilter(sort="per_gb"))]
    assert per_gb == sorted(per_gb)


def test_sort_links_work_without_javascript_and_keep_the_filter(client, catalog):
    page = client.get(reverse("catalog"), {"vendor": "nvidia", "sort": "price"}).content.decode()
    assert 'href="?vendor=nvidia&amp;sort=-price"' in page  # the active column flips direction
    singles = page.split("Whole multi-GPU nodes")[0]
    names = _offer_order(singles)
    prices = [Offer.objects.get(name="", gpu_model__name=n, gpu_count=1).monthly_cents for n in names]
    assert prices == sorted(prices) and len(prices) > 3


def test_price_per_gb_of_vram_is_monthly_over_total_vram(catalog):
    h200, pair = Offer.objects.get(slug="h200-sxm"), Offer.objects.get(slug="2x-a100-sxm")
    assert h200.per_vram_gb_month_cents == round(229000 / 141)
    assert pair.per_vram_gb_month_cents == round(188100 / 160)


def test_instance_specs_default_to_the_nodes_share_and_operator_values_win(catalog):
    node = Node.objects.filter(gpu_model__slug="h100-sxm").order_by("vcpus").first()
    rows = {r.offer.slug: r for r in catalog_rows()}
    share = min(n.vcpus // n.gpu_count for n in Node.objects.filter(gpu_model=node.gpu_model))
    assert rows["h100-sxm"].vcpus == share and rows["h100-sxm"].disk_gb == 2000
    Offer.objects.filter(slug="h100-sxm").update(vcpus=24, ram_gb=200, network_gbps=25)
    row = {r.offer.slug: r for r in catalog_rows()}["h100-sxm"]
    assert (row.vcpus, row.ram_gb, row.offer.network_gbps) == (24, 200, 25)


def test_single_cards_and_whole_nodes_are_separate_tables(client, catalog):
    page = client.get(reverse("catalog")).content.decode()
    singles, nodes = page.split("Whole multi-GPU nodes")
    assert "Single cards" in singles and "Free cards" in singles and "8× MI300X" not in singles
    assert "8× MI300X" in nodes and "Free nodes" in nodes


def test_only_link_types_actually_sold_are_offered_in_the_filter(catalog):
    unsold = Interconnect.objects.exclude(gpu_models__offers__is_active=True).distinct()
    assert unsold.exists()  # the spec's link table names cards we do not sell (B200, RTX 5090 …)
    choices = {value for value, _label in CatalogFilterForm().fields["link"].choices}
    assert not choices & set(unsold.values_list("slug", flat=True))
    sold = set(Interconnect.objects.filter(gpu_models__in=GpuModel.objects.filter(offers__is_active=True))
               .values_list("slug", flat=True))
    assert sold <= choices


def test_month_price_column_is_yuezu_in_chinese(client, catalog):
    page = client.get(reverse("catalog"), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "月租" in page
