"""Teams (ADR 0017): every customer page and API route declares the right a member's role
needs, each role gets exactly its rights, and nobody reaches another account's objects.

The URLconf is walked at run time, so a route added later without a declaration fails
`test_every_customer_page_declares_its_right` / `test_every_api_route_declares_its_right`."""
import json
import re

import pytest
from django.test import override_settings
from django.urls import URLPattern, URLResolver, get_resolver, path
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.services import checkout_place_order
from inventory.models import Offer, Site
from rental.accounts.services import api_token_create, ssh_key_add
from rental.api import api_endpoint
from rental.models import ApiScope, Image, Lease, LeaseEvent
from rental.teams.models import Membership, Role
from rental.teams.rights import PERSONAL, PUBLIC, RIGHTS, ROLE_RIGHTS, SESSION_KEY, customer_view
from storefront.api_routes import api_routes, route_right

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"

#: Where the customer's pages live (the rest is public, sign-in, the agents' API or admin).
CUSTOMER_PREFIXES = ("leases/", "account/", "order/", "billing/", "storage/mine/", "pay/", "sla/")
HOW_TO_DECLARE = (
    "declare the right it needs: a page with @customer_view(\"view\" | \"order\" | \"operate\" | \"tokens\" | "
    "\"webhooks\" | \"team\") (or {method: right}; \"public\"/\"personal\" for no account) from "
    "rental.teams.rights, outermost; an API route with api_endpoint(..., scope=..., right=...). "
    "Inside, read and write request.account (API: request.api_user), never request.user. See ADR 0017.")


def _walk(patterns, prefix=""):
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            yield route, entry.callback


def customer_pages():
    return [(route, view) for route, view in _walk(get_resolver().url_patterns)
            if route.startswith(CUSTOMER_PREFIXES)]


def undeclared_pages(pages) -> list[str]:
    return [route for route, view in pages if not getattr(view, "customer_rights", None)]


def undeclared_api(routes) -> list[str]:
    return [r.route for r in routes if any(scope is not None for scope in r.scopes.values()) and not r.rights]


def test_every_customer_page_declares_its_right(db):
    pages = customer_pages()
    assert len(pages) >= 40  # the walk found the customer's pages
    assert undeclared_pages(pages) == [], HOW_TO_DECLARE


def test_every_api_route_declares_its_right(db):
    routes = api_routes()
    assert len(routes) >= 40
    assert undeclared_api(routes) == [], HOW_TO_DECLARE
    for r in routes:
        for method, scope in r.scopes.items():
            if scope is not None:
                assert route_right(r, method) in RIGHTS, (r.route, method)


def test_an_undeclared_page_or_route_is_caught(db):
    def bare(request):
        return None

    @api_endpoint("GET", scope="read")
    def api_bare(request):
        return None

    urlconf = type("urls", (), {"urlpatterns": [
        path("leases/new/", bare), path("leases/ok/", customer_view("view")(bare)),
        path("api/v1/new", api_bare), path("api/v1/ok", api_endpoint("GET", scope="read", right="view")(bare))]})
    with override_settings(ROOT_URLCONF=urlconf):
        assert undeclared_pages(customer_pages()) == ["leases/new/"]
        assert undeclared_api(api_routes()) == ["api/v1/new"]


def test_an_undeclared_api_route_serves_owners_only(client, customer, other_customer):
    """What a merged route without `right=` does until it declares one: nothing for members."""
    @api_endpoint("GET", scope="read")
    def api_bare(request):
        from django.http import JsonResponse
        return JsonResponse({"ok": True})

    Membership.objects.create(account=customer, member=other_customer, role=Role.DEVELOPER, created_at=timezone.now())
    owner = api_token_create(customer=customer, name="o", scopes=["read"])[1]
    member = api_token_create(customer=customer, member=other_customer, name="d", scopes=["read"])[1]
    urlconf = type("urls", (), {"urlpatterns": [path("api/v1/new", api_bare)]})
    with override_settings(ROOT_URLCONF=urlconf):
        assert client.get("/api/v1/new", HTTP_AUTHORIZATION=f"Bearer {owner}").status_code == 200
        refused = client.get("/api/v1/new", HTTP_AUTHORIZATION=f"Bearer {member}")
        assert refused.status_code == 403 and refused.json()["error"] == "role_forbids"


# --- the role x route matrix ------------------------------------------------------------------

@pytest.fixture
def team(catalog, customer, other_customer, django_user_model, settings):
    """alice's account with one member per role (bob is an outsider with his own lease)."""
    settings.API_REQUESTS_PER_IP_PER_MINUTE = settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 10**6
    settings.CUSTOMER_WRITES_PER_MINUTE = 10**6
    now = timezone.now()
    members = {Role.OWNER: customer}
    for role in (Role.BILLING, Role.DEVELOPER, Role.READ_ONLY):
        user = django_user_model.objects.create_user(username=f"m-{role}", password="x" * 12)
        Membership.objects.create(account=customer, member=user, role=role, invited_by=customer, created_at=now)
        members[role] = user
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    image = Image.objects.get(slug="pytorch-2.5-cuda-12.4")
    lease, invoice = checkout_place_order(customer=customer, offer=offer, site=site, term="week", image=image,
                                          ssh_public_key=ED25519)
    theirs, their_invoice = checkout_place_order(customer=other_customer, offer=offer, site=site, term="week",
                                                 image=image, ssh_public_key=ED25519)
    key = ssh_key_add(customer=customer, name="k", public_key=ED25519)
    their_key = ssh_key_add(customer=other_customer, name="k", public_key=ED25519)
    return {"members": members, "account": customer, "outsider": other_customer,
            "mine": {"lease_id": lease.pk, "invoice_id": invoice.pk, "key_id": key.pk},
            "theirs": {"lease_id": theirs.pk, "invoice_id": their_invoice.pk, "key_id": their_key.pk}}


def concrete(route: str, values: dict) -> str:
    defaults = {"action": "restart", "rest": "no-such", "offer_slug": "rtx-3090", "token": "inv_none",
                "volume_id": 10**6, "snapshot_id": 10**6, "account_id": 10**6, "quote_id": 10**6,
                "delivery_id": 10**6, "member_id": 10**6, "invitation_id": 10**6, "notification_id": 10**6,
                "token_id": 10**6, "uidb64": "x", "credential_id": 10**6, "variable_id": 10**6,
                "name": "NO_SUCH_VARIABLE", **values}
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(defaults[m.group(1)]), route)


def page_methods(per_method: dict) -> list[str]:
    return sorted(m for m in per_method if m not in ("*", "HEAD")) or ["GET", "POST"]


def page_right(per_method: dict, method: str) -> str:
    return per_method.get(method, per_method.get("*"))


def test_each_role_gets_exactly_its_rights_on_every_page(client, team):
    """Every declared page and method, as every role: refused (403) exactly where the role
    lacks the right; where it has it, never a 403 (the view's own answer: 200, 302, 400, 404…)."""
    checked = 0
    for role, member in team["members"].items():
        client.force_login(member)
        session = client.session
        session[SESSION_KEY] = team["account"].pk
        session.save()
        for route, view in customer_pages():
            url = concrete(route, team["mine"])
            for method in page_methods(view.customer_rights):
                right = page_right(view.customer_rights, method)
                if right in (PUBLIC, PERSONAL):
                    continue
                response = client.generic(method, url, data="", content_type="application/x-www-form-urlencoded")
                if right in ROLE_RIGHTS[role]:
                    assert response.status_code != 403, (role, method, url)
                else:
                    assert response.status_code == 403, (role, method, url, response.status_code)
                checked += 1
        client.logout()
    assert checked >= 4 * 40


def test_each_role_gets_exactly_its_rights_on_every_api_route(client, team):
    """A token with every scope, made by each member: the route's right decides (403
    role_forbids), whatever the scopes; another account's objects are a 404."""
    all_scopes = list(ApiScope.values)
    checked = 0
    for role, member in team["members"].items():
        raw = api_token_create(customer=team["account"], member=member, name=role, scopes=all_scopes)[1]
        auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
        for r in api_routes():
            url = concrete(r.route, team["mine"])
            for method, scope in r.scopes.items():
                if scope is None:
                    continue
                response = client.generic(method, url, data="{}", content_type="application/json", **auth)
                if route_right(r, method) in ROLE_RIGHTS[role]:
                    assert response.status_code != 403, (role, method, url, response.content)
                else:
                    assert response.status_code == 403, (role, method, url, response.status_code)
                    assert response.json()["error"] == "role_forbids"
                checked += 1
    assert checked >= 4 * 40


def test_no_role_reaches_another_accounts_objects(client, team):
    """The outsider's lease, invoice and key: 404 on every page and route that names one, for
    every member acting for alice's account (their own rights notwithstanding)."""
    theirs = team["theirs"]
    for role, member in team["members"].items():
        raw = api_token_create(customer=team["account"], member=member, name=f"x-{role}",
                               scopes=list(ApiScope.values))[1]
        for r in api_routes():
            if not any(f"<int:{name}>" in r.route for name in theirs):
                continue
            url = concrete(r.route, theirs)
            for method, scope in r.scopes.items():
                if scope is None or route_right(r, method) not in ROLE_RIGHTS[role]:
                    continue
                response = client.generic(method, url, data="{}", content_type="application/json",
                                          HTTP_AUTHORIZATION=f"Bearer {raw}")
                assert response.status_code == 404, (role, method, url, response.content)
        client.force_login(member)
        session = client.session
        session[SESSION_KEY] = team["account"].pk
        session.save()
        for route, view in customer_pages():
            if not any(f"<int:{name}>" in route for name in theirs):
                continue
            url = concrete(route, theirs)
            for method in page_methods(view.customer_rights):
                if page_right(view.customer_rights, method) not in ROLE_RIGHTS[role]:
                    continue
                response = client.generic(method, url, data="", content_type="application/x-www-form-urlencoded")
                # 405: a method the page does not take at all (it never looked the object up)
                assert response.status_code in (404, 405), (role, method, url, response.status_code)
        client.logout()
    # and nothing of the outsider's changed hands
    assert Lease.objects.get(pk=theirs["lease_id"]).state == "pending"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_rights_invariant_over_random_teams(client, team, django_user_model, data):
    """Random memberships (a user in several accounts, in random roles, some removed) and
    random API routes: a request is served for account A only if the member's CURRENT role
    in A has the route's right, and its objects are A's (a member of B only gets B's).
    Each example runs in a savepoint rolled back after it: examples do not share state."""
    from django.db import transaction

    with transaction.atomic():
        _one_random_team(client, team, django_user_model, data)
        transaction.set_rollback(True)


def _one_random_team(client, team, django_user_model, data):
    accounts = [team["account"], team["outsider"]]
    user = django_user_model.objects.create_user(username="hypothesis-member", password="x" * 12)
    roles = {}
    for account in accounts:
        role = data.draw(st.sampled_from([None, *Role.values]), label=f"role in {account.username}")
        if role:
            Membership.objects.create(account=account, member=user, role=role, created_at=timezone.now())
        roles[account.pk] = role
    account = data.draw(st.sampled_from(accounts), label="token's account")
    raw = api_token_create(customer=account, member=user, name="h", scopes=list(ApiScope.values))[1]
    if roles[account.pk] and data.draw(st.booleans(), label="changed later"):
        new = data.draw(st.sampled_from([None, *Role.values]), label="new role")
        if new is None:
            Membership.objects.filter(account=account, member=user).delete()
        else:
            Membership.objects.filter(account=account, member=user).update(role=new)
        roles[account.pk] = new
    routes = [(r, m) for r in api_routes() for m, s in r.scopes.items() if s is not None]
    r, method = data.draw(st.sampled_from(routes), label="route")
    objects = team["mine"] if account.pk == team["account"].pk else team["theirs"]
    response = client.generic(method, concrete(r.route, objects), data="{}", content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {raw}")
    role = roles[account.pk]
    if role is None:
        assert response.status_code == 401          # not (or no longer) in the account: no power
    elif route_right(r, method) not in ROLE_RIGHTS[role]:
        assert response.status_code == 403 and response.json()["error"] == "role_forbids"
    else:
        assert response.status_code != 403
        if method == "GET" and response.status_code == 200 and r.route == "api/v1/leases":
            assert {row["id"] for row in response.json()["leases"]} == {objects["lease_id"]}


def test_a_demoted_members_token_loses_its_power_at_once(client, team):
    developer = team["members"][Role.DEVELOPER]
    raw = api_token_create(customer=team["account"], member=developer, name="d", scopes=list(ApiScope.values))[1]
    url = f"/api/v1/leases/{team['mine']['lease_id']}/stop"
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    assert client.post(url, "{}", content_type="application/json", **auth).status_code != 403
    Membership.objects.filter(member=developer).update(role=Role.READ_ONLY)
    assert client.post(url, "{}", content_type="application/json", **auth).json()["error"] == "role_forbids"
    Membership.objects.filter(member=developer).delete()
    assert client.get("/api/v1/leases", **auth).status_code == 401


def test_the_audit_rows_name_the_member_who_acted(client, team):
    """A developer stops alice's instance on the page and through the API: the LeaseEvent's
    actor is the developer, not alice (the service was given alice's account)."""
    from rental.services import lease_start_term

    developer = team["members"][Role.DEVELOPER]
    lease_id = team["mine"]["lease_id"]
    now = timezone.now()
    lease_start_term(lease_id=lease_id, now=now)
    Lease.objects.filter(pk=lease_id).update(state="active", started_at=now, ends_at=now + timezone.timedelta(days=7))
    client.force_login(developer)
    session = client.session
    session[SESSION_KEY] = team["account"].pk
    session.save()
    assert client.post(f"/leases/{lease_id}/instance/stop/").status_code == 302
    event = LeaseEvent.objects.filter(lease_id=lease_id, kind="instance_stop").latest("pk")
    assert event.actor_id == developer.pk
    raw = api_token_create(customer=team["account"], member=developer, name="d", scopes=["manage"])[1]
    response = client.post(f"/api/v1/leases/{lease_id}/start", "{}", content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 202, response.content
    event = LeaseEvent.objects.filter(lease_id=lease_id, kind="instance_start").latest("pk")
    assert event.actor_id == developer.pk


def test_a_member_sees_the_accounts_leases_and_only_their_own_tokens(client, team):
    developer = team["members"][Role.DEVELOPER]
    theirs = api_token_create(customer=team["account"], name="owner's", scopes=["read"])[0]
    mine = api_token_create(customer=team["account"], member=developer, name="dev's", scopes=["read"])[0]
    client.force_login(developer)
    session = client.session
    session[SESSION_KEY] = team["account"].pk
    session.save()
    page = client.get("/leases/")
    assert page.status_code == 200 and f"/leases/{team['mine']['lease_id']}/" in page.content.decode()
    assert "Acting for alice" in page.content.decode()
    settings_page = client.get("/account/settings/").content.decode()
    assert "dev&#x27;s" in settings_page or "dev's" in settings_page
    assert "owner&#x27;s" not in settings_page and "owner's" not in settings_page
    assert client.post(f"/account/tokens/{theirs.pk}/revoke/").status_code == 404
    assert client.post(f"/account/tokens/{mine.pk}/revoke/").status_code == 302
    # back in their own account: their own (empty) lease list, no indicator
    client.post("/account/switch/", {"account": developer.pk})
    page = client.get("/leases/").content.decode()
    assert f"/leases/{team['mine']['lease_id']}/" not in page and "Acting for" not in page


def test_switching_to_an_account_one_is_not_in_is_a_404(client, team):
    client.force_login(team["members"][Role.BILLING])
    assert client.post("/account/switch/", {"account": team["outsider"].pk}).status_code == 404
    # a session left pointing at an account they were removed from falls back to their own
    session = client.session
    session[SESSION_KEY] = team["account"].pk
    session.save()
    Membership.objects.filter(member=team["members"][Role.BILLING]).delete()
    page = client.get("/leases/").content.decode()
    assert f"/leases/{team['mine']['lease_id']}/" not in page


def test_the_docs_name_how_to_declare(db):
    """The failure message tells whoever adds a route what to write."""
    assert "customer_view" in HOW_TO_DECLARE and "right=" in HOW_TO_DECLARE
    assert json.dumps(sorted(RIGHTS))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_pages_follow_the_members_current_role(client, team, django_user_model, data):
    """The pages' side of the invariant, with the acting account in the session: a member in
    a random role gets a 403 exactly where the role lacks the right; once removed (the
    session still naming alice's account) they act for their own account again, where
    alice's objects are not found."""
    from django.db import transaction

    with transaction.atomic():
        user = django_user_model.objects.create_user(username="hypothesis-page-member", password="x" * 12)
        role = data.draw(st.sampled_from(Role.values), label="role")
        Membership.objects.create(account=team["account"], member=user, role=role, created_at=timezone.now())
        client.force_login(user)
        session = client.session
        session[SESSION_KEY] = team["account"].pk
        session.save()
        removed = data.draw(st.booleans(), label="removed after choosing the account")
        if removed:
            Membership.objects.filter(member=user).delete()
        pages = [(route, view, method) for route, view in customer_pages()
                 for method in page_methods(view.customer_rights)
                 if page_right(view.customer_rights, method) not in (PUBLIC, PERSONAL)]
        route, view, method = data.draw(st.sampled_from(pages), label="page")
        response = client.generic(method, concrete(route, team["mine"]), data="",
                                  content_type="application/x-www-form-urlencoded")
        right = page_right(view.customer_rights, method)
        if removed:
            assert response.status_code != 403          # their own account: its owner
            if any(f"<int:{name}>" in route for name in team["mine"]):
                assert response.status_code in (404, 405), (route, method, response.status_code)
        elif right in ROLE_RIGHTS[role]:
            assert response.status_code != 403, (role, method, route)
        else:
            assert response.status_code == 403, (role, method, route, response.status_code)
        client.logout()
        transaction.set_rollback(True)
