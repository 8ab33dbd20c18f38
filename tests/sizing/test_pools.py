"""sizing.pools: the filtered and month-ranked offers kept per catalog and filter are what
filtering and ranking the catalog afresh gives, and a changed catalog is not served from
what was kept for the old one."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from sizing import pools
from sizing.engine import Job
from sizing.presets import PRESETS
from sizing.recommend import _price

from .conftest import build_catalog

_JOB = Job(PRESETS["llama-2-13b"], "lora")  # no tokens: ranked by the monthly price


@settings(max_examples=100, deadline=None)
@given(picks=st.lists(st.integers(0, 100), max_size=20), vendor=st.sampled_from(["cuda", "any"]),
       site=st.sampled_from([None, "DFW-1", "AMS-1", "NOPE"]), in_stock=st.booleans(),
       price=st.integers(1, 3))
def test_the_kept_pool_is_the_filter_and_the_ranking(picks, vendor, site, in_stock, price):
    base = build_catalog()
    # repeated offers and equal prices: the ranking must keep sorted()'s order among equals
    cands = [replace(base[i % len(base)], monthly_cents=base[i % len(base)].monthly_cents // price * price)
             for i in picks]
    for _ in range(2):  # built, then kept
        pool, by_month = pools.pool(cands, vendor, site, in_stock)
        assert list(pool) == [c for c in cands if pools.eligible(c, vendor, site, in_stock)]
        assert [pool[i] for i in by_month] == sorted(pool, key=lambda c: _price(c, "none", _JOB))


def test_a_catalog_changed_in_place_is_filtered_afresh():
    cands = build_catalog()
    before, _ = pools.pool(cands, "any", None, False)
    cands.pop()
    after, _ = pools.pool(cands, "any", None, False)
    assert list(after) == cands and len(after) == len(before) - 1
    assert pools.pool(iter(cands), "any", None, False)[0] == after  # an iterable: not kept
