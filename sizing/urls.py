from django.conf import settings
from django.urls import path
from django.utils.module_loading import import_string

from . import api, views


def _page_cache(view):
    """settings.SIZING_PAGE_CACHE wraps the pages (a hook: sizing never imports inventory)."""
    hook = getattr(settings, "SIZING_PAGE_CACHE", "")
    return import_string(hook)(view) if hook else view


def _api_guard(view):
    """settings.SIZING_API_GUARD wraps the JSON API (its rate limit lives above sizing)."""
    hook = getattr(settings, "SIZING_API_GUARD", "")
    return import_string(hook)(view) if hook else view


urlpatterns = [
    path("size/", _page_cache(views.calculator), name="sizing"),
    path("size/tables/", _page_cache(views.tables), name="sizing_tables"),
    path("api/v1/estimate", _api_guard(api.estimate), name="api_estimate"),
]
