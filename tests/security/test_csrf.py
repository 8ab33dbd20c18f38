"""CSRF on every form: each POST endpoint of the site, posted without a token by a
logged-in browser (Client(enforce_csrf_checks=True)), is refused with 403 and changes
nothing. The JSON API is exempt by design: it takes bearer tokens only, never cookies
(tests/security/test_isolation.py::test_api_tokens_are_not_sessions). Login throttling is
proven in tests/rental/test_accounts.py (django-axes lock-out after 5 failures)."""
import pytest
from django.test import Client
from django.urls import reverse

from billing.models import Invoice, Quote
from rental.models import ApiToken, Lease
from tests.otp import TwoFactorClient

pytestmark = pytest.mark.django_db


def post_urls(a):
    lease, invoice, quote = a["lease"].pk, a["invoice"].pk, a["quote"].pk
    return [
        reverse("signup"), reverse("login"), reverse("logout"), reverse("password_change"),
        reverse("account_settings"), reverse("token_create"), reverse("token_revoke", args=[a["token"].pk]),
        reverse("notifications_read_all"), reverse("notification_read", args=[a["notification"].pk]),
        reverse("order", args=["rtx-3090"]), reverse("billing:balance"),
        reverse("billing:invoice_pay", args=[invoice]), reverse("billing:lease_refund", args=[lease]),
        reverse("payments:invoice", args=[invoice]), reverse("payments:confirm_late", args=[quote]),
        reverse("sla:claims"), reverse("otp_setup"), reverse("otp_verify"),
        reverse("otp_recovery_codes"), reverse("otp_disable"), reverse("recovery_codes"),
        reverse("forgot_password"), reverse("password_reset"),
        reverse("admin:login"), reverse("admin:logout"),
    ]


def test_every_form_refuses_a_post_without_csrf_token(alices, customer):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(customer)
    before = (Lease.objects.count(), Invoice.objects.count(), Quote.objects.count(),
              ApiToken.objects.filter(revoked_at__isnull=True).count())
    for url in post_urls(alices):
        response = browser.post(url, {"coin": "LTC", "name": "x", "amount": "50", "site": "DFW-1", "term": "week"})
        assert response.status_code == 403, (url, response.status_code)
    after = (Lease.objects.count(), Invoice.objects.count(), Quote.objects.count(),
             ApiToken.objects.filter(revoked_at__isnull=True).count())
    assert after == before
    assert browser.get(reverse("account_settings")).status_code == 200  # still logged in: logout was refused


def test_staff_forms_refuse_a_post_without_csrf_token(catalog, operator):
    browser = TwoFactorClient(enforce_csrf_checks=True)
    browser.force_login(operator)
    for url in ("/admin/rental/lease/", "/admin/auth/user/add/", reverse("otp_setup")):
        assert browser.post(url, {"action": "delete_selected", "code": "123456"}).status_code == 403, url


def test_a_post_with_the_token_from_the_page_is_accepted(catalog, customer):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(customer)
    page = browser.get(reverse("account_settings"))
    token = page.context["csrf_token"]
    response = browser.post(reverse("token_create"), {"name": "ci", "csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302 and ApiToken.objects.filter(name="ci").exists()
