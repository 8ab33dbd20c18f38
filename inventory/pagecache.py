"""Whole-page cache for anonymous visitors of the catalog pages.

A page is kept per process (inventory.selectors.cached_by_generation) under the catalog
generation, the path with its query, the language and whether it is an htmx request, for
at most CATALOG_CACHE_SECONDS; any stock change bumps the generation. Only anonymous
requests without a session or pending messages are served from it, and only 200s are
kept. Every page carries a CSRF token (base.html's hx-headers): it is swapped for a
placeholder when the page is stored and for this visitor's own fresh token when served,
so no two visitors ever share a token.
"""
import re
import secrets
from functools import wraps

from django.conf import settings
from django.http import HttpResponse
from django.middleware.csrf import _unmask_cipher_token, get_token
from django.utils.translation import get_language

from .selectors import cached_by_generation, catalog_generation

PLACEHOLDER = "csrf-placeholder-" + secrets.token_hex(16)
_TOKEN = re.compile(r"\b[a-zA-Z0-9]{64}\b")


def _cacheable(request) -> bool:
    return (request.method == "GET" and getattr(settings, "CATALOG_CACHE_SECONDS", 0) > 0
            and settings.SESSION_COOKIE_NAME not in request.COOKIES and "messages" not in request.COOKIES
            and not request.user.is_authenticated)


def _without_token(request, content: str) -> str:
    secret = request.META["CSRF_COOKIE"]
    return _TOKEN.sub(lambda m: PLACEHOLDER if _unmask_cipher_token(m.group(0)) == secret else m.group(0), content)


def anonymous_page_cache(view):
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not _cacheable(request):
            return view(request, *args, **kwargs)
        generation = catalog_generation()
        if generation is None:  # no working shared cache: render every time
            return view(request, *args, **kwargs)
        fresh = {}

        def build():
            # the view need not keep this answer itself too (sizing.views' memo): this cache does
            request.kept_by_page_cache = True
            response = view(request, *args, **kwargs)
            fresh["response"] = response
            if response.status_code != 200 or response.streaming or response.cookies.keys() - {"csrftoken"}:
                return None
            # get_token() flags the cookie for sending (CSRF_COOKIE_NEEDS_UPDATE) whenever a page
            # asks for the token: unflagged, none was rendered (an htmx fragment), so the page is
            # kept as sent, not decoded and searched (~13 KB; a browser sends its cookie)
            if not request.META.get("CSRF_COOKIE_NEEDS_UPDATE"):
                return response["Content-Type"], response.content
            return response["Content-Type"], _without_token(request, response.content.decode(response.charset))

        # the locale middleware's language as it activated it (get_language() reads a context-local)
        language = getattr(request, "LANGUAGE_CODE", None) or get_language()
        # META, not request.headers: that builds a case-insensitive copy of every header
        meta = request.META
        # the path and the query as sent: get_full_path() quotes both again for the same identity
        query = meta.get("QUERY_STRING")
        parts = (f"{request.path}?{query}" if query else request.path, language, meta.get("HTTP_HX_REQUEST", ""),
                 meta.get("HTTP_HX_TARGET", ""))
        page = cached_by_generation("page", parts, build, generation=generation)
        if "response" in fresh:
            return fresh["response"]
        if page is None:  # a non-cacheable answer was stored: render again
            return view(request, *args, **kwargs)
        content_type, content = page
        token = get_token(request)  # this visitor's own, and their cookie
        if isinstance(content, str):
            content = content.replace(PLACEHOLDER, token)
        return HttpResponse(content, content_type=content_type)
    return wrapper
