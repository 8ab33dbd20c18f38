"""The calculator and tables pages keep their rendered parts per process, keyed on
the live candidates — so a stock change shows at once, with the catalog cache on (as in
production), and queries per page stay constant."""

import re

import pytest
from django.core.cache import cache
from django.test import Client

from inventory import selectors
from inventory.models import GpuModel, Node
from inventory.services import node_set_draining
from sizing import api, views

QUERY = "/size/?model=llama-2-7b&method=qlora&in_stock=on"


@pytest.fixture
def cached(settings, monkeypatch, db):
    from inventory.demo import load_demo_catalog

    load_demo_catalog()
    settings.CATALOG_CACHE_SECONDS = 60
    monkeypatch.setattr(selectors, "GENERATION_LOCAL_SECONDS", 0)
    for memo in (selectors._MEMO, views.RENDERED, api._MEMO):
        memo.clear()
    cache.clear()
    yield
    for memo in (selectors._MEMO, views.RENDERED, api._MEMO):
        memo.clear()
    cache.clear()


def _a5000_stock(html: str) -> dict[str, int]:
    """The recommended A5000 row's per-site free badges."""
    row = html.split('<tr class="best">')[1].split("</tr>")[0]
    assert "RTX A5000" in row
    return {site: int(n) for site, n in re.findall(r'<span class="badge[^"]*">([A-Z]+-\d) (\d+)</span>', row)}


def test_free_count_change_shows_at_once_on_the_recommendation(cached, django_capture_on_commit_callbacks):
    client = Client()
    before = _a5000_stock(client.get(QUERY, HTTP_HX_REQUEST="true").content.decode())
    assert _a5000_stock(client.get(QUERY, HTTP_HX_REQUEST="true").content.decode()) == before
    # an anonymous visitor's answer is kept by the whole-page cache, not by the view's memo too
    assert len(views.RENDERED) == 0 and any(key[0] == "page" for key in selectors._MEMO)
    node = Node.objects.filter(gpu_model=GpuModel.objects.get(slug="rtx-a5000"), site__code="DFW-1").first()
    with django_capture_on_commit_callbacks(execute=True):  # the service bumps the generation on commit
        node_set_draining(node=node, draining=True, reason="test")
    after = _a5000_stock(client.get(QUERY, HTTP_HX_REQUEST="true").content.decode())
    assert after["DFW-1"] < before["DFW-1"] and after["IAD-1"] == before["IAD-1"]
    page = client.get(QUERY).content.decode()  # the full page agrees
    assert _a5000_stock(page) == after
    api_free = client.get("/api/v1/estimate?model=llama-2-7b&method=qlora").json()["recommendations"][0]
    assert api_free["free_by_site"]["DFW-1"] == after["DFW-1"]


def test_a_signed_in_visitors_answer_is_kept_by_the_views_memo(cached, customer,
                                                               django_capture_on_commit_callbacks):
    """The whole-page cache serves anonymous visitors only; a signed-in customer's repeat is
    answered from the view's memo, and a stock change shows at once for them too."""
    client = Client()
    client.force_login(customer)
    first = client.get(QUERY, HTTP_HX_REQUEST="true")
    assert first.status_code == 200 and len(views.RENDERED) == 1
    assert client.get(QUERY, HTTP_HX_REQUEST="true").content == first.content
    assert len(views.RENDERED) == 1 and not any(key[0] == "page" for key in selectors._MEMO)
    before = _a5000_stock(first.content.decode())
    node = Node.objects.filter(gpu_model=GpuModel.objects.get(slug="rtx-a5000"), site__code="DFW-1").first()
    with django_capture_on_commit_callbacks(execute=True):
        node_set_draining(node=node, draining=True, reason="test")
    after = _a5000_stock(client.get(QUERY, HTTP_HX_REQUEST="true").content.decode())
    assert after["DFW-1"] < before["DFW-1"] and after["IAD-1"] == before["IAD-1"]
    assert len(views.RENDERED) == 2  # a new catalog is a new key


def test_memo_is_per_language_and_per_query(cached):
    client = Client()
    en = client.get(QUERY, HTTP_HX_REQUEST="true", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    zh = client.get(QUERY, HTTP_HX_REQUEST="true", HTTP_ACCEPT_LANGUAGE="zh-Hans").content.decode()
    assert en != zh and "推荐" in zh and "recommended" in en
    other = client.get("/size/?model=llama-2-13b&method=qlora", HTTP_HX_REQUEST="true").content.decode()
    assert "llama-2-13b, qlora" in other and "llama-2-13b" not in en
    assert client.get("/size/?seq=abc", HTTP_HX_REQUEST="true").status_code == 400  # errors too
    assert client.get("/size/?seq=abc", HTTP_HX_REQUEST="true").status_code == 400


def test_tables_follow_a_price_change_at_once(cached):
    from inventory.models import Offer

    client = Client()
    assert "$190" in client.get("/size/tables/").content.decode()
    Offer.objects.filter(slug="rtx-a5000").update(monthly_cents=12345)
    selectors.catalog_changed()
    assert "$123.45" in client.get("/size/tables/").content.decode()


@pytest.mark.parametrize("url", [QUERY, "/size/tables/"])
def test_queries_per_page_constant_with_the_memo(cached, django_assert_max_num_queries, url):
    client = Client()
    with django_assert_max_num_queries(6) as first:
        client.get(url)
    with django_assert_max_num_queries(len(first.captured_queries)):
        client.get(url)


def test_anonymous_pages_use_the_page_cache_and_stay_correct(cached, django_capture_on_commit_callbacks):
    """With the page cache on (settings.SIZING_PAGE_CACHE), anonymous visitors get whole pages
    from it, each with their own CSRF token, and a stock change still shows at once."""
    first = Client().get(QUERY)
    assert any(key[0] == "page" and key[1][0].startswith("/size/") for key in selectors._MEMO)
    second = Client().get(QUERY)
    token = re.compile(r'"X-CSRFToken": "([^"]+)"')
    assert token.search(first.content.decode()).group(1) != token.search(second.content.decode()).group(1)
    before = _a5000_stock(second.content.decode())
    node = Node.objects.filter(gpu_model=GpuModel.objects.get(slug="rtx-a5000"), site__code="IAD-1").first()
    with django_capture_on_commit_callbacks(execute=True):
        node_set_draining(node=node, draining=True, reason="test")
    assert _a5000_stock(Client().get(QUERY).content.decode())["IAD-1"] < before["IAD-1"]
