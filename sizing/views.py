"""The calculator page (full page and its htmx results fragment) and the tables page.

Both are pure functions of (the query, the language, the catalog's candidates), so their
expensive parts — the estimate, the recommendation and the rendered HTML — are kept per
process (``sizing.memo``) under a key that holds the candidates themselves: a stock or
price change is a new key and shows at once. Only the page shell (base.html: the visitor's
CSRF token and navigation) is rendered on every request. An answer the whole-page cache
keeps (an anonymous visitor's, settings.SIZING_PAGE_CACHE) is not kept here as well.
"""

from functools import partial

from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe
from django.utils.translation import get_language
from django.views.decorators.http import require_GET

from . import SizingInputError, figures
from .forms import DEFAULTS, SizingForm, quick_engine_params
from .fragment import results_bytes, results_html
from .frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS
from .memo import Memo
from .results import candidates, catalog_key, known_sites, run

#: rendered calculator parts and tables bodies, per process (bench/load.py)
RENDERED = Memo(max_entries=256)


def _bound(query) -> bool:
    """Bound only when the query carries a calculator field (not e.g. ?utm_source=)."""
    return any(name in query for name in SizingForm.base_fields)


def _query_key(query) -> tuple:
    if isinstance(query, QueryDict):  # a dict of value lists: read directly (getlist copies through three calls)
        return tuple((name, tuple(values)) for name in SizingForm.base_fields
                     if (values := dict.get(query, name)) is not None)
    return tuple((name, tuple(query.getlist(name))) for name in SizingForm.base_fields if name in query)


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


def _calculator_parts(query, cands, *, with_form: bool) -> tuple[int, str, str | None]:
    """(status, results fragment HTML, form HTML or None) for this query and catalog. The
    htmx fragment needs no form HTML: rendering its ~20 widgets is most of a cold render."""
    sites = known_sites(cands)
    form = SizingForm(query, sites=sites) if _bound(query) else SizingForm(initial=DEFAULTS, sites=sites)
    result, status = _size(form, cands)
    return (status, results_html(form, result),
            render_to_string("sizing/_form.html", {"form": form, "result": result}) if with_form else None)


def _fragment(query, cands) -> tuple[int, str | bytes, None]:
    """The htmx answer: no form HTML, and no form at all unless it has an error to show
    (``quick_engine_params``); an input the engine refuses goes the form's way, which
    places the error next to its field."""
    params = quick_engine_params(query, known_sites(cands)) if _bound(query) else DEFAULTS
    if params is not None:
        try:
            return 200, results_bytes(None, run(params, cands)), None
        except SizingInputError:
            pass
    return _calculator_parts(query, cands, with_form=False)


def request_language(request) -> str | None:
    """The active language: the locale middleware's, as it activated it (``get_language()``
    finds it again through a context-local, a few µs a call); ``get_language()`` without it."""
    return getattr(request, "LANGUAGE_CODE", None) or get_language()


@require_GET
def calculator(request):
    cands = candidates()
    htmx = request.META.get("HTTP_HX_REQUEST") == "true"  # request.htmx's test, without request.headers
    build = partial(_fragment, request.GET, cands) if htmx else partial(
        _calculator_parts, request.GET, cands, with_form=True)
    # a page the whole-page cache keeps (settings.SIZING_PAGE_CACHE: an anonymous visitor's)
    # is not kept here too: a repeat never reaches the view, and on an input not seen before
    # this memo's key and entry were ~1 % of the answer
    if getattr(request, "kept_by_page_cache", False):
        status, body, form_html = build()
    else:
        key = ("calculator", htmx, request_language(request), _query_key(request.GET), catalog_key(cands))
        status, body, form_html = RENDERED.get(key, build)
    if htmx:
        return HttpResponse(body, status=status)
    context = {"results_html": mark_safe(body), "form_html": mark_safe(form_html)}  # noqa: S308 - our output
    return render(request, "sizing/calculator.html", context, status=status)


def _tables_body(cands) -> str:
    return render_to_string("sizing/_tables_body.html", {
        "first_rows": figures.first_document_table(cands),
        "scale_rows": figures.scale_table(cands),
        "zero_rows": figures.zero_table(),
        "zero_params_b": figures.zero_example_params_b(),
        "zero_model": figures.ZERO_EXAMPLE_MODEL,
        "zero_usable_gb": figures.usable_gb(figures.ZERO_EXAMPLE_CARD_GB),
        "zero_gpus": figures.ZERO_EXAMPLE_GPUS,
        "zero_card_gb": figures.ZERO_EXAMPLE_CARD_GB,
        "switches": figures.memory_switches(),
        "tables_framework": FRAMEWORKS[DEFAULT_FRAMEWORK],
    })


@require_GET
def tables(request):
    cands = candidates()
    body = RENDERED.get(("tables", get_language(), catalog_key(cands)), lambda: _tables_body(cands))
    return render(request, "sizing/tables.html", {"body": mark_safe(body)})  # noqa: S308 - our template's output
