"""The offers one answer may be sized on, kept per catalog and filter.

Every cold answer filters the catalog by vendor, site and stock four times (the
recommendation and each one-change plan) and, when the job gives no tokens, ranks the
offers by their monthly price (then the faster): neither depends on the job, only on the
catalog and the filter, so both are kept per (catalog, vendor, site, in-stock filter) and
reused by every input with that filter, seen or not. A catalog is the provider's list
(``sizing.results.candidates``: the same list object until stock or prices change); the
kept entry holds the offers themselves and is used only while the list still holds
exactly those, so a changed or new list is filtered afresh.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterable
from typing import Any

#: ``sizing.recommend.Candidate`` (imported from here, so named loosely: no import circle)
Candidate = Any

#: kept filters (catalogs × vendor × site × stock); cleared whole when full
MAX_KEPT = 64
_kept: dict[tuple, tuple] = {}
_lock = threading.Lock()


def eligible(c: Candidate, vendor: str, site: str | None, in_stock: bool) -> bool:
    if vendor == "cuda" and c.vendor != "nvidia":
        return False
    if site is not None and site not in c.free_by_site:
        return False
    return not in_stock or c.free(site) > 0


def monthly_key(c: Candidate) -> tuple:
    """``recommend._price`` of an offer for a job without tokens: the monthly price, again,
    then the faster."""
    return (c.monthly_cents, c.monthly_cents, -c.total_tflops)


def _build(cands: tuple, vendor: str, site: str | None, in_stock: bool) -> tuple:
    pool = tuple(c for c in cands if eligible(c, vendor, site, in_stock))
    # indexes into the pool, cheapest first: a stable sort, so the order sorted() gives the offers
    order = tuple(sorted(range(len(pool)), key=lambda i: monthly_key(pool[i])))
    return cands, pool, order


def pool(candidates: Iterable[Candidate], vendor: str, site: str | None,
         in_stock: bool) -> tuple[tuple[Candidate, ...], tuple[int, ...]]:
    """(the offers that pass the filter, in the catalog's order; their indexes ranked by
    ``monthly_key``)."""
    if not isinstance(candidates, list):
        return _build(tuple(candidates), vendor, site, in_stock)[1:]
    key = (id(candidates), vendor, site, in_stock)
    hit = _kept.get(key)
    # the same offers (identity): a list changed in place or a new list at a reused id is not
    if hit is not None and len(hit[0]) == len(candidates) and all(map(operator.is_, hit[0], candidates)):
        return hit[1], hit[2]
    value = _build(tuple(candidates), vendor, site, in_stock)
    with _lock:
        if len(_kept) >= MAX_KEPT:
            _kept.clear()
        _kept[key] = value
    return value[1], value[2]
