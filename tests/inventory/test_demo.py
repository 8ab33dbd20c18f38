"""The demo catalog (inventory.demo) and images (rental.demo): an empty database gets each
table in one INSERT, and the rows, their order and so their ids are exactly what the
idempotent upserts write; loading again changes nothing; the catalog cache hears of it."""
import pytest
from django.db import models as m

from inventory import demo
from inventory.models import GpuModel, GpuSlot, Interconnect, Node, Offer, Site, StorageProduct
from inventory.selectors import catalog_changed
from rental import demo as images_demo
from rental.models import Image

pytestmark = pytest.mark.django_db

CATALOG = [Site, Interconnect, GpuModel, Offer, StorageProduct, Node, GpuSlot]   # parents before children
NATURAL_KEY = {Site: "code", Interconnect: "slug", GpuModel: "slug", Offer: "slug", StorageProduct: "kind",
               Node: "name", Image: "slug"}


def _natural(model, pk) -> object:
    if model is GpuSlot:
        slot = GpuSlot.objects.select_related("node").get(pk=pk)
        return (slot.node.name, slot.index)
    return model.objects.values_list(NATURAL_KEY[model], flat=True).get(pk=pk)


def snapshot(tables) -> dict:
    """Every row of each table in id order, without ids or the moment it was written: foreign
    keys as the row they name."""
    out = {}
    for model in tables:
        rows = []
        for obj in model.objects.order_by("pk"):
            row = {}
            for f in model._meta.concrete_fields:
                if f.primary_key or getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False):
                    continue
                value = getattr(obj, f.attname)
                row[f.name] = _natural(f.related_model, value) if isinstance(f, m.ForeignKey) and value else value
            rows.append(row)
        out[model.__name__] = rows
    return out


def test_an_empty_catalog_gets_the_rows_the_upserts_write_in_their_order():
    created = demo.load_demo_catalog()
    fresh = snapshot(CATALOG)
    assert created == len(fresh["Node"]) > 0
    assert len(fresh["GpuSlot"]) == sum(n["gpu_count"] for n in fresh["Node"])
    assert [o["slug"] for o in fresh["Offer"]][-len(demo.MULTI_GPU_OFFERS):] == [
        f"{count}x-{gpu}" for gpu, count, *_ in demo.MULTI_GPU_OFFERS]

    for model in reversed(CATALOG):
        model.objects.all().delete()
    demo._upsert_catalog()           # the path a catalog already there takes, row by row
    assert demo._create_nodes() == created
    assert snapshot(CATALOG) == fresh


def test_loading_again_changes_nothing_and_keeps_an_operators_prices():
    demo.load_demo_catalog()
    Offer.objects.filter(slug="h100-sxm").update(monthly_cents=1)
    Site.objects.filter(code="DFW-1").update(name="renamed")
    before = snapshot(CATALOG)
    assert demo.load_demo_catalog() == 0
    after = snapshot(CATALOG)
    assert after["Offer"] == before["Offer"]                            # prices kept
    assert [s["name"] for s in after["Site"] if s["code"] == "DFW-1"] == ["Dallas"]   # the demo's figures back
    assert after["Node"] == before["Node"] and after["GpuSlot"] == before["GpuSlot"]


def test_the_catalog_cache_hears_of_a_new_catalog(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        demo.load_demo_catalog()
    assert catalog_changed in callbacks


def test_images_one_insert_or_upserts_alike():
    images_demo.load_demo_images()
    fresh = snapshot([Image])
    assert [i["slug"] for i in fresh["Image"]] == [slug for slug, *_ in images_demo.IMAGES] + [
        t["slug"] for t in images_demo.TEMPLATES]
    Image.objects.all().delete()
    Image.objects.create(slug="operator-own", name="Operator's image", vendor="nvidia")
    images_demo.load_demo_images()    # not empty: the upserts
    upserted = snapshot([Image])["Image"]
    assert upserted[0]["slug"] == "operator-own" and upserted[1:] == fresh["Image"]
    images_demo.load_demo_images()
    assert snapshot([Image])["Image"] == upserted
