"""Security by default: headers on every page, production settings pass check --deploy,
and page query counts do not grow with the inventory."""
import os
import subprocess
import sys

import pytest
from django.urls import reverse

from inventory.models import GpuSlot, Node, Site
from tests.security.helpers import ROOT, TEST_ONLY_ENV

# What production must set; the database is never connected to by these checks.
PRODUCTION_ENV = {"DEBUG": "0", "DJANGO_SETTINGS_MODULE": "storefront.settings", "ALLOWED_HOSTS": "gpus.example.com",
                  "DATABASE_URL": "postgres://storefront:secret@db.invalid:5432/storefront"}


def test_security_headers_on_pages(client, catalog):
    response = client.get(reverse("catalog"))
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Content-Type-Options"] == "nosniff"


def test_production_settings_pass_check_deploy():
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env.update(PRODUCTION_ENV, SECRET_KEY="x" * 20 + "prod-like-secret-key-with-enough-entropy-Q7#kP")
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize("backend", ["django.core.mail.backends.console.EmailBackend",
                                     "django.core.mail.backends.locmem.EmailBackend"])
def test_production_refuses_an_email_backend_that_writes_reset_links_to_the_log(backend):
    """With the console backend a password-reset link landed in the web log."""
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env.update(PRODUCTION_ENV, SECRET_KEY="x" * 20 + "prod-like-secret-key-with-enough-entropy-Q7#kP",
               EMAIL_BACKEND=backend)
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "rental.E001" in result.stderr and backend in result.stderr, result.stderr


def test_production_sends_hsts_and_secure_cookies():
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
    env.update(PRODUCTION_ENV, SECRET_KEY="s" * 60)
    code = ("from django.conf import settings as s; import django; django.setup(); "
            "print(s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60).stdout.split()
    assert int(out[0]) >= 31536000 and out[1:] == ["True", "True", "True"]


def add_nodes(count: int):
    from inventory.models import GpuModel

    site, model = Site.objects.first(), GpuModel.objects.get(slug="rtx-3090")
    for i in range(count):
        node = Node.objects.create(site=site, name=f"extra-{i}", gpu_model=model, gpu_count=8, vcpus=64,
                                   host_ram_gb=512)
        GpuSlot.objects.bulk_create([GpuSlot(node=node, index=k) for k in range(8)])


@pytest.mark.parametrize("name", ["home", "catalog", "faq"])
def test_page_queries_do_not_grow_with_nodes(client, catalog, django_assert_max_num_queries, name):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as before:
        client.get(reverse(name))
    add_nodes(25)
    with django_assert_max_num_queries(len(before.captured_queries)):
        assert client.get(reverse(name)).status_code == 200
