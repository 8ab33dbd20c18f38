"""The calculator page (full page and its htmx results fragment) and the tables page."""

from django.shortcuts import render
from django.views.decorators.http import require_GET

from . import SizingInputError, figures
from .forms import DEFAULTS, SizingForm
from .frameworks import FRAMEWORKS, SOURCE_TABLES_FRAMEWORK
from .results import candidates, known_sites, run


def _bound(query) -> bool:
    """Bound only when the query carries a calculator field (not e.g. ?utm_source=)."""
    return any(name in query for name in SizingForm.base_fields)


def _size(form: SizingForm, cands):
    """(result or None, HTTP status); engine errors land on the form's fields."""
    if not form.is_bound:
        return run(DEFAULTS, cands), 200
    if not form.is_valid():
        return None, 400
    try:
        return run(form.engine_params(), cands), 200
    except SizingInputError as exc:
        form.add_engine_error(exc.field, exc.message)
        return None, 400


@require_GET
def calculator(request):
    cands = candidates()
    sites = known_sites(cands)
    if _bound(request.GET):
        form = SizingForm(request.GET, sites=sites)
    else:
        form = SizingForm(initial=DEFAULTS, sites=sites)
    result, status = _size(form, cands)
    template = "sizing/_results.html" if request.htmx else "sizing/calculator.html"
    return render(request, template, {"form": form, "result": result}, status=status)


@require_GET
def tables(request):
    cands = candidates()
    context = {
        "first_rows": figures.first_document_table(cands),
        "scale_rows": figures.scale_table(cands),
        "zero_rows": figures.zero_table(),
        "zero_params_b": round(figures.ZERO_EXAMPLE_PARAMS / 1e9),
        "zero_gpus": figures.ZERO_EXAMPLE_GPUS,
        "zero_card_gb": figures.ZERO_EXAMPLE_CARD_GB,
        "switches": figures.memory_switches(),
        "tables_framework": FRAMEWORKS[SOURCE_TABLES_FRAMEWORK],
    }
    return render(request, "sizing/tables.html", context)
