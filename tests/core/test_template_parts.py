"""core/template_parts.py: the page frame's links, rendered once and shown twice."""
import re

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def nav_copies(html: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r'<div class="nav-(?:wide|menu-body)">(.*?)</div>', html, re.S)]


@pytest.mark.parametrize("signed_in", [False, True])
def test_the_links_are_rendered_once_and_shown_wide_and_in_the_phone_menu(client, customer, signed_in):
    if signed_in:
        client.force_login(customer)
    response = client.get(reverse("lease_list") if signed_in else reverse("faq"))
    assert response.status_code == 200
    assert [t.name for t in response.templates].count("_nav_links.html") == 1
    wide, menu = nav_copies(response.content.decode())
    assert wide == menu
    # the signed-in links, with the logout form's token, or the visitor's
    assert (reverse("lease_list") in wide and 'name="csrfmiddlewaretoken"' in wide) if signed_in \
        else (reverse("login") in wide and reverse("lease_list") not in wide)


def test_a_variable_the_links_set_stays_inside_them(client, customer):
    """The part renders in a pushed context: `unread` and `acting_nav` do not leak into the page."""
    from django.template import Context, Template

    page = Template('{% load parts %}{% rendered "_nav_links.html" as links %}[{{ unread }}{{ acting_nav }}]')
    from django.test import RequestFactory

    request = RequestFactory().get("/")
    request.user = customer
    assert page.render(Context({"user": customer, "request": request})).endswith("[]")
