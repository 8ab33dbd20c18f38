"""Issue 16's attacks, run as an attacker would: real HTTP (requests) against a live server
(pytest-django's live_server, the whole middleware stack, the database of the run: SQLite
by default, PostgreSQL with DATABASE_URL). Each test is one attack and checks both the
answer and that nothing changed behind it.

CSRF, two-factor bypass, staff without permissions, NUL bytes and deep nesting, stock
hoarding, refund abuse and token scopes."""
import json
import re
from datetime import datetime

import pytest
import requests
from django.contrib.auth.models import User
from django.core.cache import cache
from django.utils import timezone

from billing.services import balance_top_up
from rental.models import ApiToken, Lease, LeaseState
from rental.services_customer import api_token_create
from tests.billing.test_pages import ED25519
from tests.otp import authenticator_for, code_for

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct horse battery 9"
STAFF_PASSWORD = "operator pass 12345"
ORDER = {"offer": "rtx-3090", "site": "DFW-1", "term": "week", "ssh_key": ED25519}
TIMEOUT = 20


@pytest.fixture
def server(live_server, transactional_db):
    from inventory.demo import load_demo_catalog
    from rental.demo import load_demo_images

    load_demo_catalog()
    load_demo_images()
    cache.clear()
    yield live_server.url
    cache.clear()


class Browser:
    """A cookie-keeping HTTP client that fills forms the way a browser does (CSRF token
    from the page) unless told not to."""

    def __init__(self, base: str):
        self.base, self.http = base, requests.Session()

    def get(self, path, **kw):
        return self.http.get(self.base + path, allow_redirects=False, timeout=TIMEOUT, **kw)

    def token(self, path) -> str:
        page = self.http.get(self.base + path, timeout=TIMEOUT).text
        return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)

    def post(self, path, data, *, token_from=None, csrf=True, **kw):
        if csrf:
            data = {**data, "csrfmiddlewaretoken": self.token(token_from or path)}
        return self.http.post(self.base + path, data=data, allow_redirects=False, timeout=TIMEOUT, **kw)

    def login(self, username, password):
        response = self.post("/accounts/login/", {"username": username, "password": password})
        assert response.status_code == 302, response.text[:300]
        return response


def api(base, method, path, raw=None, body=None, data=None):
    headers = {"Authorization": f"Bearer {raw}"} if raw else {}
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body), "application/json"
    return requests.request(method, base + path, data=data, headers=headers, timeout=TIMEOUT)


def make_customer(username="mallory", email=""):
    from rental.services import account_create

    return account_create(username=username, password=PASSWORD, email=email)


# --- CSRF -------------------------------------------------------------------------------------

def test_csrf_a_forged_post_from_another_site_is_refused(server):
    user = make_customer()
    victim = Browser(server)
    victim.login("mallory", PASSWORD)
    forged = victim.post("/account/tokens/", {"name": "attacker"}, csrf=False,
                         headers={"Origin": "https://evil.example", "Referer": "https://evil.example/x"})
    assert forged.status_code == 403
    forged = victim.post("/account/settings/", {"email": "attacker@evil.example"}, csrf=False)
    assert forged.status_code == 403
    assert not ApiToken.objects.filter(customer=user).exists()
    user.refresh_from_db()
    assert user.email == ""
    honest = victim.post("/account/tokens/", {"name": "mine"}, token_from="/account/settings/")
    assert honest.status_code == 200 and honest.headers["Cache-Control"] == "no-store"


# --- two-factor bypass ----------------------------------------------------------------------------

@pytest.fixture
def staff_with_totp(transactional_db):
    user = User.objects.create_superuser(username="op", password=STAFF_PASSWORD)
    return user, authenticator_for(user)


def test_2fa_a_stolen_password_alone_opens_nothing(server, staff_with_totp):
    user, device = staff_with_totp
    thief = Browser(server)
    thief.login("op", STAFF_PASSWORD)
    for path in ("/admin/", "/admin/auth/user/", "/admin/ops/exports/?what=invoices&date_from=2025-01-01&date_to=2025-12-31",
                 "/accounts/password/", "/account/settings/", "/accounts/otp/setup/", "/accounts/otp/recovery-codes/"):
        response = thief.get(path)
        assert response.status_code == 302 and "/accounts/otp/verify/" in response.headers["Location"], path
    # Changing the password or enrolling the thief's phone: sent to the code step, nothing saved.
    response = thief.post("/accounts/password/", {"old_password": STAFF_PASSWORD, "new_password1": "thief pass 90210",
                                                  "new_password2": "thief pass 90210"}, token_from="/accounts/login/")
    assert response.status_code == 302 and "/accounts/otp/verify/" in response.headers["Location"]
    response = thief.post("/accounts/otp/setup/", {"code": "123456"}, token_from="/accounts/login/")
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.check_password(STAFF_PASSWORD) and user.totpdevice_set.count() == 1
    # Guessing codes: wrong ones are refused and throttle the device (even the right one, right after).
    assert thief.post("/accounts/otp/verify/", {"code": "000000"}).status_code == 400
    assert thief.post("/accounts/otp/verify/", {"code": code_for(device)}).status_code == 400
    assert thief.get("/admin/").status_code == 302


def test_2fa_the_code_step_then_opens_the_admin_and_next_stays_on_site(server, staff_with_totp):
    _user, device = staff_with_totp
    operator = Browser(server)
    operator.login("op", STAFF_PASSWORD)
    response = operator.post("/accounts/otp/verify/", {"code": code_for(device), "next": "https://evil.example/"})
    assert response.status_code == 302 and response.headers["Location"] == "/admin/"
    assert operator.get("/admin/").status_code == 200


def test_2fa_staff_without_an_authenticator_must_enrol_first(server, transactional_db):
    User.objects.create_superuser(username="fresh", password=STAFF_PASSWORD)
    newcomer = Browser(server)
    newcomer.login("fresh", STAFF_PASSWORD)
    for path in ("/admin/", "/admin/auth/user/", "/leases/", "/accounts/password/"):
        response = newcomer.get(path)
        assert response.status_code == 302 and "/accounts/otp/setup/" in response.headers["Location"], path


# --- staff without permissions --------------------------------------------------------------------

def test_staff_without_permissions_cannot_download_every_customers_invoices(server):
    clerk = User.objects.create_user(username="clerk", password=STAFF_PASSWORD, is_staff=True)
    device = authenticator_for(clerk)
    browser = Browser(server)
    browser.login("clerk", STAFF_PASSWORD)
    assert browser.post("/accounts/otp/verify/", {"code": code_for(device)}).status_code == 302
    assert browser.get("/admin/").status_code == 200
    for what in ("invoices", "payments", "leases"):
        response = browser.get(f"/admin/ops/exports/?what={what}&date_from=2020-01-01&date_to=2030-12-31")
        assert response.status_code == 403 and "text/csv" not in response.headers.get("Content-Type", ""), what
    assert browser.get("/admin/ops/dashboard/").status_code == 403
    assert browser.get("/admin/ops/holds/").status_code == 403


# --- bad input ----------------------------------------------------------------------------------

def test_nul_bytes_and_deep_nesting_are_400s_not_500s(server, staff_with_totp):
    raw = api_token_create(customer=make_customer(), name="fuzz")[1]
    for body in ('{"offer": "rtx-3090\\u0000"}', '{"offer": ' + "[" * 5000 + "]" * 5000 + "}",
                 '{"offer": "rtx-3090", "site": "DFW-1\\u0000", "term": "week"}'):
        response = api(server, "POST", "/api/v1/orders", raw, data=body.encode())
        assert response.status_code == 400 and response.json()["error"] == "bad_json", body[:40]
    _user, device = staff_with_totp
    operator = Browser(server)
    operator.login("op", STAFF_PASSWORD)
    operator.post("/accounts/otp/verify/", {"code": code_for(device)})
    for path in ("/admin/rental/lease/?state=%00", "/admin/billing/invoice/?q=%00", "/admin/auth/user/?%00=1"):
        assert operator.get(path).status_code == 400, path
    response = operator.get("/admin/ops/exports/?what=leases&date_from=2025-01-01&date_to=9999-12-31")
    assert response.status_code == 200 and "Dates must be between" in response.text
    assert not Lease.objects.exists()


# --- stock hoarding -------------------------------------------------------------------------------

def test_a_free_account_cannot_hold_the_stock(server, settings):
    raw = api_token_create(customer=make_customer(), name="hoarder")[1]
    created = [api(server, "POST", "/api/v1/orders", raw, ORDER) for _ in range(4)]
    assert [r.status_code for r in created] == [201, 201, 409, 409]
    assert created[2].json()["error"] == "too_many_unpaid_orders"
    holds = [r.json()["lease"] for r in created[:2]]
    for lease in holds:  # the short hold of an account that never paid
        held = datetime.fromisoformat(lease["pay_by"]) - datetime.fromisoformat(lease["created_at"])
        assert held.total_seconds() <= settings.PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES * 60 + 5
    assert Lease.objects.filter(state=LeaseState.PENDING).count() == 2


def test_sign_ups_from_one_address_are_throttled(server, settings):
    settings.SIGNUPS_PER_IP = 2
    answers = []
    for n in range(3):
        response = Browser(server).post("/accounts/signup/", {"username": f"sock{n}", "password1": PASSWORD,
                                                              "password2": PASSWORD})
        answers.append(response.status_code)
    assert answers == [200, 200, 429]
    assert not User.objects.filter(username="sock2").exists()


# --- refund abuse -----------------------------------------------------------------------------------

def test_the_one_hour_refund_cannot_be_repeated_all_month(server):
    user = make_customer()
    balance_top_up(customer=user, amount_cents=1_000_00, now=timezone.now())
    raw = api_token_create(customer=user, name="all")[1]
    refunds = []
    for _ in range(2):
        lease = api(server, "POST", "/api/v1/orders", raw, {**ORDER, "pay_from_balance": True}).json()["lease"]
        refunds.append(api(server, "POST", f"/api/v1/leases/{lease['id']}/refund", raw, {}))
    assert refunds[0].status_code == 200 and refunds[0].json()["refunded_cents"] == 6500
    assert refunds[1].status_code == 409 and refunds[1].json()["error"] == "refund_limit_reached"
    assert Lease.objects.filter(customer=user, state=LeaseState.CANCELLED).count() == 1


# --- token scopes -------------------------------------------------------------------------------------

def test_a_leaked_read_token_cannot_order_spend_or_refund(server):
    user = make_customer()
    balance_top_up(customer=user, amount_cents=1_000_00, now=timezone.now())
    full = api_token_create(customer=user, name="all")[1]
    lease = api(server, "POST", "/api/v1/orders", full, {**ORDER, "pay_from_balance": True}).json()["lease"]
    leaked = api_token_create(customer=user, name="grafana", scopes=["read"])[1]
    assert api(server, "GET", "/api/v1/leases", leaked).status_code == 200
    for method, path, body in (("POST", "/api/v1/orders", ORDER),
                               ("POST", "/api/v1/orders", {**ORDER, "pay_from_balance": True}),
                               ("POST", f"/api/v1/leases/{lease['id']}/refund", {})):
        response = api(server, method, path, leaked, body)
        assert response.status_code == 403 and response.json()["error"] == "insufficient_scope", path
    assert Lease.objects.filter(customer=user).count() == 1


def test_a_password_change_kills_tokens_made_before_it(server):
    user = make_customer()
    raw = api_token_create(customer=user, name="old laptop")[1]
    browser = Browser(server)
    browser.login("mallory", PASSWORD)
    response = browser.post("/accounts/password/", {"old_password": PASSWORD, "new_password1": "a new pass 55123",
                                                    "new_password2": "a new pass 55123"})
    assert response.status_code == 302
    assert api(server, "GET", "/api/v1/leases", raw).status_code == 401
