from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import get_language
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from sizing.figures import faq_vram_figures

from .burnin import offer_card_facts
from .forms import CatalogFilterForm
from .models import GpuModel, Interconnect, Offer, StorageProduct
from .pagecache import anonymous_page_cache
from .selectors import (
    CatalogFilter,
    active_sites,
    cached_by_generation,
    catalog_rows,
    sites_with_stock_for,
)


def _headline_range(rows):
    """'$190/month for a 24 GB card to $12,170/month for an 8× node' — from live prices."""
    if not rows:
        return None, None
    cheapest = min(rows, key=lambda r: r.offer.monthly_cents)
    dearest = max(rows, key=lambda r: r.offer.monthly_cents)
    return cheapest, dearest


@require_GET
@anonymous_page_cache
def home(request):
    rows = catalog_rows()
    cheapest, dearest = _headline_range(rows)
    context = {
        "cheapest": cheapest,
        "dearest": dearest,
        "featured": [r for r in rows if r.offer.gpu_count == 1][:6],
        "gpus_free": sum(r.free_total * r.offer.gpu_count for r in rows if r.offer.gpu_count == 1),
        "sites": active_sites(),
    }
    return render(request, "inventory/home.html", context)


def _filter_from_form(form: CatalogFilterForm) -> CatalogFilter:
    data = form.cleaned_data
    return CatalogFilter(
        min_vram_gb=data.get("min_vram"),
        vendor=data.get("vendor") or None,
        interconnect=data.get("link") or None,
        site=data.get("site") or None,
        max_monthly_cents=data["max_price"] * 100 if data.get("max_price") else None,
        in_stock=bool(data.get("in_stock")),
        sort=data.get("sort") or "",
    )


def _catalog_table(form: CatalogFilterForm) -> str:
    rows = catalog_rows(_filter_from_form(form) if form.is_bound else None)
    sites = list(active_sites())
    if form.is_bound and form.cleaned_data.get("site"):
        sites = [s for s in sites if s.code == form.cleaned_data["site"]]
    groups = [(_("Single cards"), [r for r in rows if r.offer.gpu_count == 1]),
              (_("Whole multi-GPU nodes"), [r for r in rows if r.offer.gpu_count > 1])]
    sort = form.cleaned_data.get("sort", "") if form.is_bound else ""
    context = {"form": form, "rows": rows, "groups": [g for g in groups if g[1]], "sites": sites,
               "sort": sort, "query": form.query_without_sort()}
    return render_to_string("inventory/_catalog_table.html", context)


@require_GET
@anonymous_page_cache
def catalog(request):
    """The table is the costly part: rendered once per filter and language and cached with
    the catalog rows (inventory.selectors.cached_by_generation; a stock change bumps it)."""
    form = CatalogFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():
        status = 400
        table = render_to_string("inventory/_catalog_table.html", {"form": form, "rows": [], "sites": []})
    else:
        status = 200
        flt = _filter_from_form(form) if form.is_bound else CatalogFilter()
        table = cached_by_generation("table", (flt, get_language()), lambda: _catalog_table(form))
    if request.htmx:
        return HttpResponse(table, status=status)
    return render(request, "inventory/catalog.html", {"form": form, "table": table}, status=status)


@require_GET
def gpu_detail(request, slug: str):
    try:
        gpu = GpuModel.objects.select_related("interconnect").get(slug=slug)
    except GpuModel.DoesNotExist as exc:
        raise Http404("No such GPU") from exc
    offers = [
        (offer, sites_with_stock_for(offer))
        for offer in Offer.objects.filter(gpu_model=gpu, is_active=True).select_related("gpu_model")
    ]
    rows = [(offer, free, offer_card_facts(offer)) for offer, free in offers]
    return render(request, "inventory/gpu_detail.html", {"gpu": gpu, "offers": offers, "rows": rows})


@require_GET
def links(request):
    return render(request, "inventory/links.html", {"interconnects": Interconnect.objects.all()})


@require_GET
def storage(request):
    from django.conf import settings

    return render(request, "inventory/storage.html", {"products": StorageProduct.objects.all(),
                                                      "object_price": settings.OBJECT_STORAGE_CENTS_PER_TB_MONTH})


@require_GET
def faq(request):
    rows = catalog_rows()
    offers = {r.offer.slug.replace("-", "_"): r.offer for r in rows}
    cheapest, dearest = _headline_range(rows)
    context = {
        "offers": offers, "cheapest": cheapest, "dearest": dearest,
        "vram": faq_vram_figures(), "sizing_url": reverse("sizing"),
    }
    return render(request, "inventory/faq.html", context)


# --- trust pages: status, terms, privacy -----------------------------------------------------

@require_GET
def status(request):
    from django.conf import settings
    from django.utils import timezone

    from .status import site_statuses

    sites, incidents = site_statuses(now=timezone.now(), days=settings.STATUS_PAGE_DAYS)
    context = {"sites": sites, "incidents": incidents, "days": settings.STATUS_PAGE_DAYS}
    return render(request, "inventory/status.html", context)


@require_GET
def terms(request):
    return render(request, "inventory/terms.html")


@require_GET
def privacy(request):
    return render(request, "inventory/privacy.html")
