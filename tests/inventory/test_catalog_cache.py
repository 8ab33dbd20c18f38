"""The catalog cache (inventory.selectors.cached_by_generation, inventory.pagecache): on in
production, off by default in tests; here it is on. A stock change is seen at once, each
anonymous visitor gets their own CSRF token from a cached page, signed-in visitors are
never served a cached page."""
import re

import pytest
from django.core.cache import cache
from django.middleware.csrf import _unmask_cipher_token
from django.test import Client
from django.urls import reverse

from billing.services import checkout_place_order
from inventory import selectors
from inventory.models import Offer, Site
from rental.models import Image

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


@pytest.fixture
def cached(settings, monkeypatch):
    settings.CATALOG_CACHE_SECONDS = 60
    monkeypatch.setattr(selectors, "GENERATION_LOCAL_SECONDS", 0)
    selectors._MEMO.clear()
    cache.clear()
    yield
    selectors._MEMO.clear()
    cache.clear()


def free_cell(html: str, offer_slug: str) -> str:
    row = html[html.index(f"/order/{offer_slug}/") - 3000:html.index(f"/order/{offer_slug}/")]
    return re.findall(r'class="num free"[^>]*><strong>(\d+)</strong>', row)[-1]


def test_an_order_shows_in_the_cached_catalog_at_once(catalog, cached, customer, django_capture_on_commit_callbacks):
    offer = Offer.objects.get(slug="rtx-3090")
    before = free_cell(Client().get(reverse("catalog")).content.decode(), offer.slug)
    assert selectors.catalog_rows() is selectors.catalog_rows()  # served from the cache
    with django_capture_on_commit_callbacks(execute=True):
        checkout_place_order(customer=customer, offer=offer, site=Site.objects.get(code="DFW-1"), term="week",
                             image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                             pay_from_balance=False)
    after = free_cell(Client().get(reverse("catalog")).content.decode(), offer.slug)
    assert int(after) == int(before) - 1
    api = Client().get(reverse("api_offers")).json()["offers"]
    assert next(o for o in api if o["slug"] == offer.slug)["free_total"] == int(after)


def test_cached_pages_carry_each_visitors_own_csrf_token(catalog, cached):
    tokens = []
    for _ in range(3):
        response = Client().get(reverse("catalog") + "?vendor=nvidia&min_vram=40")
        assert response.status_code == 200 and "csrf-placeholder" not in response.content.decode()
        token = re.search(r'"X-CSRFToken": "([^"]+)"', response.content.decode()).group(1)
        assert _unmask_cipher_token(token) == response.cookies["csrftoken"].value
        tokens.append(response.cookies["csrftoken"].value)
    assert len(set(tokens)) == 3
    assert any(key[0] == "page" for key in selectors._MEMO)


def test_signed_in_visitors_are_not_served_cached_pages(catalog, cached, client, customer):
    Client().get(reverse("home"))  # an anonymous copy is cached
    client.force_login(customer)
    assert customer.username in client.get(reverse("home")).content.decode()


def test_catalog_pages_render_without_a_working_cache(catalog, cached, monkeypatch):
    monkeypatch.setattr(selectors, "catalog_generation", lambda: None)
    from inventory import pagecache

    monkeypatch.setattr(pagecache, "catalog_generation", lambda: None)
    for name in ("home", "catalog"):
        assert Client().get(reverse(name)).status_code == 200


def test_a_cached_fragment_is_served_as_it_was_sent(catalog, cached):
    """An htmx fragment carries no token: from a visitor without a CSRF cookie it is kept as
    the bytes sent (not decoded and encoded again), and served alike to every visitor,
    with or without the cookie; the visitor's own cookie is still set."""
    url = "/size/?model=llama-3.1-8b&method=lora&seq=4096&vendor=any"
    first = Client().get(url, HTTP_HX_REQUEST="true")
    assert first.status_code == 200
    stored = next(v[2] for k, v in selectors._MEMO.items() if k[0] == "page" and k[1][0] == url)
    assert stored[1] == first.content  # bytes, as sent
    with_cookie = Client()
    with_cookie.get(reverse("catalog"))  # sets csrftoken
    assert "csrftoken" in with_cookie.cookies
    for client in (Client(), with_cookie):
        again = client.get(url, HTTP_HX_REQUEST="true")
        assert again.content == first.content and again["Content-Type"] == first["Content-Type"]
        assert again.cookies["csrftoken"].value  # get_token: the visitor's own


def test_a_fragment_first_asked_for_with_a_cookie_is_kept_as_sent_too(catalog, cached):
    """No token was rendered into it (the view never asked for one), so a browser's request,
    which carries its CSRF cookie, keeps the fragment as the bytes sent, with no search; a
    full page asked for with the cookie still has that visitor's token taken out."""
    browser = Client()
    browser.get(reverse("catalog") + "?vendor=amd")  # sets csrftoken
    secret = browser.cookies["csrftoken"].value
    fragment = "/size/?model=qwen2.5-7b&method=qlora&seq=2048&vendor=any"
    sent = browser.get(fragment, HTTP_HX_REQUEST="true")
    assert sent.status_code == 200 and "csrftoken" not in sent.cookies  # no token asked for
    pages = {k[1][0]: v[2] for k, v in selectors._MEMO.items() if k[0] == "page"}
    assert pages[fragment][1] == sent.content
    page = reverse("catalog") + "?vendor=nvidia"
    shown = browser.get(page).content.decode()
    token = re.search(r'"X-CSRFToken": "([^"]+)"', shown).group(1)
    assert _unmask_cipher_token(token) == secret
    stored = {k[1][0]: v[2] for k, v in selectors._MEMO.items() if k[0] == "page"}[page][1]
    assert isinstance(stored, str) and token not in stored and "csrf-placeholder" in stored
