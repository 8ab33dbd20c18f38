"""Every /api/v1 route with the scope each method needs, read from the URLconf and the
views' own declarations (rental.api.api_endpoint): the source of docs/API.md's table and of
the test that walks every route with every scope. `python -m storefront.api_routes` prints
the table (`DEBUG=1` on a development checkout)."""
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver

API_PREFIX = "api/v1/"


@dataclass(frozen=True)
class ApiRoute:
    route: str          # e.g. "api/v1/leases/<int:lease_id>/extend"
    view: object
    scopes: dict        # {method: scope or None (public)}; empty: the view declared none
    also: dict          # {scope: when it is needed as well}
    rights: dict | None = None  # {method or "*": right} (teams, ADR 0017); None: declared none


def route_right(r: ApiRoute, method: str) -> str | None:
    if not r.rights:
        return None
    return r.rights.get(method, r.rights.get("*"))


def _walk(patterns, prefix=""):
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            yield route, entry.callback


def api_routes() -> list[ApiRoute]:
    routes = []
    for route, view in _walk(get_resolver().url_patterns):
        if route.startswith(API_PREFIX):
            rights = getattr(view, "api_rights", None)
            routes.append(ApiRoute(route, view, dict(getattr(view, "api_scopes", {})),
                                   dict(getattr(view, "api_also", {})), dict(rights) if rights else None))
    return routes


def scope_table() -> str:
    """The Markdown table of docs/API.md: one row per route and method."""
    rows = ["| Method | Route | Scope | Role's right | Also needs |", "| --- | --- | --- | --- | --- |"]
    for r in api_routes():
        also = "; ".join(f"`{s}` {when}" for s, when in r.also.items()) or "—"
        by_scope: dict = {}
        for method, scope in r.scopes.items():  # methods sharing a scope and right share a row
            right = route_right(r, method) if scope else None
            by_scope.setdefault((scope, right), []).append(method)
        for (scope, right), methods in by_scope.items():
            shown_right = f"`{right}`" if right else ("—" if not scope else "**undeclared** (owners only)")
            rows.append(f"| {', '.join(methods)} | `/{r.route}` | {f'`{scope}`' if scope else 'public'} "
                        f"| {shown_right} | {also} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")
    django.setup()
    print(scope_table(), end="")
