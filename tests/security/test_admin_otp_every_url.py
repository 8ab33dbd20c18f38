"""Staff two-factor on every admin URL (three sample paths stood in for "every").
The URLconf is walked for every route under /admin/ — each ModelAdmin's changelist, add,
change, delete and history pages, app indexes and the custom ops pages — and each is
requested, GET and POST, by staff who gave only their password: an enrolled one is sent
to the code step, one without an authenticator to enrolment, never to the page."""
import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.otp import authenticator_for

pytestmark = pytest.mark.django_db
PASSWORD = "operator pass 12345"
EXEMPT = {"/admin/logout/"}  # signing out needs no code


def admin_paths() -> list[str]:
    """Every route under admin/, path converters filled with 1 (the middleware runs before
    the view, so the object need not exist)."""
    out = set()

    def walk(patterns, prefix):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith(("admin/", "^admin/")):
                path = re.sub(r"<(?:\w+:)?\w+>", "1", route.lstrip("^").rstrip("$"))
                if not re.search(r"[\\()\[\]?*+]", path):  # regex routes (admin's catch-all) aside
                    out.add("/" + path)

    walk(get_resolver().url_patterns, "")
    return sorted(out - EXEMPT)


def test_the_walk_finds_the_admin(catalog):
    paths = admin_paths()
    for expected in ("/admin/", "/admin/rental/lease/", "/admin/rental/lease/1/change/", "/admin/rental/lease/add/",
                     "/admin/billing/invoice/", "/admin/auth/user/1/delete/", "/admin/ops/exports/"):
        assert expected in paths, expected
    assert len(paths) > 100


@pytest.mark.parametrize("enrolled, step", [(True, "otp_verify"), (False, "otp_setup")])
def test_staff_with_only_a_password_reach_no_admin_url(django_user_model, catalog, enrolled, step):
    staff = django_user_model.objects.create_superuser(username="op2", password=PASSWORD)
    if enrolled:
        authenticator_for(staff)
    client = Client()
    response = client.post(reverse("login"), {"username": "op2", "password": PASSWORD})
    assert response.status_code == 302
    target = reverse(step)
    reached = []
    for path in admin_paths():
        for method in (client.get, client.post):
            response = method(path)
            if response.status_code != 302 or not response["Location"].startswith(target):
                reached.append((method.__name__, path, response.status_code))
    assert not reached, reached
