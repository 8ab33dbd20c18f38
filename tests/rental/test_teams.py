"""Teams (ADR 0017): invitations, the Team page, roles and removals, the team API, and the
audit rows that name who did each (tests/rental/test_team_rights.py proves the rights)."""
import json
import re

import pytest
from django.core import mail
from django.utils import timezone

from inventory.models import AuditEntry
from rental.accounts.services import api_token_create
from rental.models import ApiScope, Lease, LeaseEvent
from rental.teams.models import Invitation, Membership, Role
from rental.teams.rights import SESSION_KEY
from rental.teams.services import (
    TeamRefused,
    invitation_accept,
    invitation_create,
    member_remove,
    member_role_set,
)

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


def act_for(client, user, account):
    client.force_login(user)
    session = client.session
    session[SESSION_KEY] = account.pk
    session.save()


def member(account, user, role, by=None):
    return Membership.objects.create(account=account, member=user, role=role, invited_by=by or account,
                                     created_at=timezone.now())


@pytest.fixture
def carol(django_user_model):
    return django_user_model.objects.create_user(username="carol", password="x" * 12, email="carol@example.org")


def test_an_owner_invites_by_the_page_and_the_invitee_joins(client, customer, other_customer, settings,
                                                             django_capture_on_commit_callbacks):
    settings.WORKBENCH_TEAM_INVITE_DAYS = 3
    client.force_login(customer)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/account/team/invite/", {"email": "bob@example.org", "role": "developer"})
    assert response.status_code == 302
    page = client.get("/account/team/").content.decode()
    link = re.search(r'value="(http://testserver/account/team/join/inv_[\w-]+/)"', page).group(1)
    assert link not in client.get("/account/team/").content.decode()          # shown once
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["bob@example.org"]
    assert link.removeprefix("http://testserver") in mail.outbox[0].body
    invitation = Invitation.objects.get()
    assert invitation.expires_at - invitation.created_at == timezone.timedelta(days=3)
    assert AuditEntry.objects.filter(action="team_invite", actor=customer).count() == 1

    client.logout()
    signed_out = client.get(link).content.decode()
    assert "/accounts/login/?next=" in signed_out and "/accounts/signup/?next=" in signed_out
    client.force_login(other_customer)
    assert client.post(link).status_code == 302
    joined = Membership.objects.get(account=customer, member=other_customer)
    assert joined.role == Role.DEVELOPER and joined.invited_by == customer
    assert client.session[SESSION_KEY] == customer.pk                       # acting for alice now
    assert AuditEntry.objects.filter(action="team_join", actor=other_customer).count() == 1
    # single use
    client.post(link)
    assert Membership.objects.filter(member=other_customer).count() == 1
    assert "used" in client.get(link).content.decode()


def test_an_expired_or_withdrawn_invitation_is_refused(customer, other_customer, carol):
    now = timezone.now()
    _invitation, raw = invitation_create(account=customer, email="bob@example.org", role="billing",
                                         invited_by=customer, now=now)
    with pytest.raises(TeamRefused, match="expired"):
        invitation_accept(raw=raw, user=other_customer, now=now + timezone.timedelta(days=8))
    withdrawn, raw2 = invitation_create(account=customer, email="carol@example.org", role="billing",
                                        invited_by=customer, now=now)
    Invitation.objects.filter(pk=withdrawn.pk).update(revoked_at=now)
    with pytest.raises(TeamRefused, match="withdrawn"):
        invitation_accept(raw=raw2, user=carol, now=now)
    with pytest.raises(TeamRefused, match="own account"):
        invitation_accept(raw=raw, user=customer, now=now)
    assert not Membership.objects.exists()


def test_only_owners_change_the_team(client, customer, other_customer, carol):
    member(customer, other_customer, Role.DEVELOPER)
    member(customer, carol, Role.BILLING)
    act_for(client, other_customer, customer)
    assert client.get("/account/team/").status_code == 200                   # every member sees it
    assert "Invite" not in client.get("/account/team/").content.decode()
    for url, data in [("/account/team/invite/", {"email": "x@example.org", "role": "owner"}),
                      ("/account/team/role/", {"member": carol.pk, "role": "owner"}),
                      ("/account/team/remove/", {"member": carol.pk})]:
        assert client.post(url, data).status_code == 403, url
    assert Membership.objects.get(member=carol).role == Role.BILLING and not Invitation.objects.exists()


def test_roles_change_and_members_leave_with_audit_rows_naming_who(client, customer, other_customer, carol):
    member(customer, other_customer, Role.OWNER)
    member(customer, carol, Role.READ_ONLY)
    act_for(client, other_customer, customer)                                 # bob, a second owner
    assert client.post("/account/team/role/", {"member": carol.pk, "role": "developer"}).status_code == 302
    assert Membership.objects.get(member=carol).role == Role.DEVELOPER
    row = AuditEntry.objects.get(action="team_role")
    assert row.actor == other_customer and row.detail == {"account": customer.pk, "member": carol.pk,
                                                          "from": "read_only", "to": "developer"}
    # the account holder stays an owner: neither demoted nor removed
    client.post("/account/team/role/", {"member": customer.pk, "role": "read_only"})
    client.post("/account/team/remove/", {"member": customer.pk})
    assert not AuditEntry.objects.filter(action="team_remove").exists()
    assert client.post("/account/team/remove/", {"member": carol.pk}).status_code == 302
    assert AuditEntry.objects.get(action="team_remove").actor == other_customer
    assert not Membership.objects.filter(member=carol).exists()
    # bob leaves; his session falls back to his own account
    assert client.post("/account/team/leave/").status_code == 302
    assert not Membership.objects.filter(member=other_customer).exists()
    assert AuditEntry.objects.filter(action="team_remove", actor=other_customer).count() == 2


def test_the_last_owner_cannot_be_demoted_or_removed(customer, other_customer):
    """The holder is an owner always, so the team is never without one; the rule holds for
    them whoever asks (a second owner included)."""
    member(customer, other_customer, Role.OWNER)
    with pytest.raises(TeamRefused, match="always an owner"):
        member_role_set(account=customer, member_id=customer.pk, role="billing", actor=other_customer)
    with pytest.raises(TeamRefused, match="always an owner"):
        member_remove(account=customer, member_id=customer.pk, actor=other_customer)
    # a second owner may be demoted: the holder remains
    assert member_role_set(account=customer, member_id=other_customer.pk, role="billing", actor=customer)


def test_a_removed_member_loses_the_account_on_their_next_request(client, customer, other_customer, catalog):
    member(customer, other_customer, Role.READ_ONLY)
    from billing.services import checkout_place_order
    from inventory.models import Offer, Site
    from rental.models import Image

    lease, _invoice = checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                           site=Site.objects.get(code="DFW-1"), term="week",
                                           image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"),
                                           ssh_public_key=ED25519)
    act_for(client, other_customer, customer)
    assert client.get(f"/leases/{lease.pk}/").status_code == 200
    member_remove(account=customer, member_id=other_customer.pk, actor=customer)
    assert client.get(f"/leases/{lease.pk}/").status_code == 404


def test_the_team_api(client, customer, other_customer, carol, settings):
    settings.API_REQUESTS_PER_IP_PER_MINUTE = settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 10**6
    member(customer, carol, Role.DEVELOPER)
    owner = api_token_create(customer=customer, name="o", scopes=list(ApiScope.values))[1]
    dev = api_token_create(customer=customer, member=carol, name="d", scopes=list(ApiScope.values))[1]

    def call(method, url, raw, body=None):
        return client.generic(method, url, json.dumps(body or {}), content_type="application/json",
                              HTTP_AUTHORIZATION=f"Bearer {raw}")

    seen = call("GET", "/api/v1/team", dev).json()
    assert seen["you"] == {"username": "carol", "role": "developer", "rights": ["operate", "tokens", "view"]}
    assert [m["username"] for m in seen["members"]] == ["alice", "carol"] and "invitations" not in seen
    assert call("POST", "/api/v1/team", dev, {"email": "x@example.org", "role": "owner"}).status_code == 403

    made = call("POST", "/api/v1/team", owner, {"email": "bob@example.org", "role": "billing"})
    assert made.status_code == 201 and made.json()["link"].startswith("/account/team/join/inv_")
    assert call("POST", "/api/v1/team", owner, {"email": "bob@example.org", "role": "boss"}).status_code == 400
    assert [i["email"] for i in call("GET", "/api/v1/team", owner).json()["invitations"]] == ["bob@example.org"]
    assert call("DELETE", f"/api/v1/team/invitations/{made.json()['id']}", owner).status_code == 200

    assert call("PATCH", f"/api/v1/team/members/{carol.pk}", owner, {"role": "read_only"}).json()["role"] == "read_only"
    assert call("PATCH", f"/api/v1/team/members/{customer.pk}", owner, {"role": "billing"}).status_code == 409
    assert call("PATCH", f"/api/v1/team/members/{other_customer.pk}", owner, {"role": "billing"}).status_code == 404
    assert call("DELETE", f"/api/v1/team/members/{carol.pk}", owner).json() == {"removed": carol.pk}
    assert call("GET", "/api/v1/team", dev).status_code == 401               # her token: no power left
    member(customer, carol, Role.DEVELOPER)                                  # invited again later:
    assert call("GET", "/api/v1/team", dev).status_code == 401               # the old token stays dead
    assert AuditEntry.objects.filter(action__in=["team_invite", "team_invite_revoke", "team_role", "team_remove"],
                                     actor=customer).count() == 4


def test_a_billing_member_orders_for_the_account_and_the_event_names_them(client, customer, carol, catalog, settings):
    settings.API_REQUESTS_PER_IP_PER_MINUTE = settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 10**6
    member(customer, carol, Role.BILLING)
    raw = api_token_create(customer=customer, member=carol, name="b", scopes=list(ApiScope.values))[1]
    response = client.post("/api/v1/orders", json.dumps({"offer": "rtx-3090", "site": "DFW-1", "term": "week",
                                                         "ssh_key": ED25519}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 201, response.content
    lease = Lease.objects.get(pk=response.json()["lease"]["id"])
    assert lease.customer == customer                                        # the account's lease
    assert LeaseEvent.objects.get(lease=lease, kind="created").actor == carol  # carol ordered it


def test_a_refused_member_is_told_why_and_where(client, customer, other_customer):
    member(customer, other_customer, Role.READ_ONLY)
    act_for(client, other_customer, customer)
    response = client.post("/account/ssh-keys/", {"name": "k", "public_key": ED25519})
    assert response.status_code == 403
    page = response.content.decode()
    assert "Your role in the account alice does not allow this" in page and 'href="/account/team/"' in page


def test_ids_past_the_column_are_not_found(client, customer, settings):
    settings.API_REQUESTS_PER_IP_PER_MINUTE = settings.API_REQUESTS_PER_TOKEN_PER_MINUTE = 10**6
    raw = api_token_create(customer=customer, name="o", scopes=list(ApiScope.values))[1]
    for method, url in [("DELETE", f"/api/v1/team/members/{2**64}"), ("PATCH", f"/api/v1/team/members/{2**64}"),
                        ("DELETE", f"/api/v1/team/invitations/{2**64}")]:
        response = client.generic(method, url, json.dumps({"role": "billing"}), content_type="application/json",
                                  HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert response.status_code == 404, (method, url, response.content)
    client.force_login(customer)
    assert client.post("/account/switch/", {"account": str(2**64)}).status_code == 404
    assert client.post("/account/team/remove/", {"member": str(2**64)}).status_code == 404


def test_an_invitee_without_an_account_signs_up_from_the_link_and_joins(client, customer, settings):
    settings.SIGNUPS_PER_IP = settings.SIGNUP_ATTEMPTS_PER_IP = 100
    _invitation, raw = invitation_create(account=customer, email="dana@example.org", role="read_only",
                                         invited_by=customer)
    link = f"/account/team/join/{raw}/"
    offer = client.get(link).content.decode()
    signup = re.search(r'href="(/accounts/signup/\?next=[^"]+)"', offer).group(1)
    response = client.post(signup.replace("&amp;", "&"), {
        "username": "dana", "email": "dana@example.org", "password1": "a long pass phrase 42",
        "password2": "a long pass phrase 42", "next": link})
    assert response.status_code == 302
    codes_page = client.get(response["Location"]).content.decode()   # recovery codes first, then back
    assert link in codes_page
    assert client.post(link).status_code == 302
    joined = Membership.objects.get(account=customer)
    assert joined.member.username == "dana" and joined.role == Role.READ_ONLY


@pytest.mark.parametrize("role, shown", [
    (Role.READ_ONLY, set()),
    (Role.DEVELOPER, {"ssh_key_create", "token_create"}),
    (Role.BILLING, set()),
    (Role.OWNER, {"ssh_key_create", "token_create", "webhook_save", "account_settings"}),
])
def test_the_settings_page_offers_only_the_forms_the_role_may_post(client, customer, other_customer, role, shown):
    from django.urls import reverse

    member(customer, other_customer, role)
    act_for(client, other_customer, customer)
    page = client.get("/account/settings/").content.decode()
    forms = {"ssh_key_create", "token_create", "webhook_save", "account_settings"}
    assert {name for name in forms if f'action="{reverse(name)}"' in page} == shown
