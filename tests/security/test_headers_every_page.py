"""Security headers on every page, not just one: the public pages, a customer's pages,
the staff pages, the JSON API and an error page all carry a CSP that allows only our own
scripts (and no inline script on any page), frame-ancestors 'none', X-Frame-Options DENY,
a referrer policy and nosniff; with production's HSTS settings, HSTS on every page served
over HTTPS (the settings themselves: tests/security/test_headers_and_settings.py)."""
import re

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse

from tests.otp import TwoFactorClient

pytestmark = pytest.mark.django_db

PUBLIC = ["/", "/gpus/", "/gpus/?vendor=nvidia&min_vram=40", "/gpus/rtx-3090/", "/links/", "/storage/", "/faq/",
          "/size/", "/size/?model=llama-2-13b&method=lora", "/size/tables/", "/accounts/login/", "/accounts/signup/",
          "/api/v1/offers", "/api/v1/schema", "/api/v1/estimate?model=llama-2-13b&method=lora", "/no-such-page/"]


def customer_pages(a):
    return [reverse("lease_list"), reverse("lease_detail", args=[a["lease"].pk]), reverse("billing:invoices"),
            reverse("billing:invoice", args=[a["invoice"].pk]), reverse("billing:balance"),
            reverse("account_settings"), reverse("order", args=["rtx-3090"]), reverse("password_change"),
            reverse("payments:invoice", args=[a["invoice"].pk]), reverse("payments:quote", args=[a["quote"].pk]),
            reverse("sla:claims")]


STAFF = ["/admin/", "/admin/rental/lease/", "/admin/ops/dashboard/", "/admin/ops/exports/", "/admin/ops/customers/",
         "/accounts/otp/setup/"]
ERROR_PAGES = {"/no-such-page/"}  # the error page answers 404 (with the headers); every other page 200


def check(response, url):
    csp = response["Content-Security-Policy"]
    directives = dict((d.split(" ", 1) + [""])[:2] for d in (p.strip() for p in csp.split(";")) if d)
    assert directives["script-src"] == "'self'", (url, csp)
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'", url
    assert directives["default-src"] == "'self'" and directives["base-uri"] == "'self'", url
    assert response["X-Frame-Options"] == "DENY", url
    assert response["Referrer-Policy"] == "same-origin", url
    assert response["X-Content-Type-Options"] == "nosniff", url
    assert response["Permissions-Policy"] == settings.PERMISSIONS_POLICY, url
    if response.get("Content-Type", "").startswith("text/html"):
        html = response.content.decode()
        for tag in re.findall(r"<script\b[^>]*>", html):  # same-origin files only, nothing inline
            assert re.search(r'\bsrc="/(?!/)', tag) or 'type="application/json"' in tag, (url, tag)
        assert not re.search(r"\son(click|load|error|submit|change)=", html), url


def fetch(client, urls):
    for url in urls:
        response = client.get(url)
        assert response.status_code == (404 if url in ERROR_PAGES else 200), (url, response.status_code)
        check(response, url)


def test_public_pages(catalog, client):
    fetch(client, PUBLIC)


def test_customer_pages(alices, client, customer):
    client.force_login(customer)
    fetch(client, customer_pages(alices))


def test_staff_pages(catalog, client, operator):
    client.force_login(operator)
    fetch(client, STAFF)


@override_settings(SECURE_HSTS_SECONDS=31536000, SECURE_HSTS_INCLUDE_SUBDOMAINS=True, SECURE_HSTS_PRELOAD=True)
def test_hsts_on_every_page_over_https(alices, customer, operator):
    anonymous, signed_in, staff = Client(), Client(), TwoFactorClient()
    signed_in.force_login(customer)
    staff.force_login(operator)
    for client, urls in ((anonymous, PUBLIC), (signed_in, customer_pages(alices)), (staff, STAFF)):
        for url in urls:
            response = client.get(url, secure=True)
            assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload", url
