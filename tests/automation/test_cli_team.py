"""`gpu-rent team` against the live test server over real HTTP (like tests/automation/test_cli.py):
list, invite (the link printed once), change a role, remove, withdraw an invitation."""
import json
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from rental.accounts.services import api_token_create
from rental.teams.models import Invitation, Membership, Role

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cli"))

from gpu_rent import errors  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def test_gpu_rent_team(cli, customer, other_customer):
    Membership.objects.create(account=customer, member=other_customer, role=Role.DEVELOPER,
                              created_at=timezone.now())
    token = api_token_create(customer=customer, name="cli", scopes=["read", "manage"])[1]
    assert cli("login", "--url", cli.url, "--token-stdin", stdin=token + "\n")[0] == 0

    code, out, err = cli("team", "invite", "carol@example.org", "billing")
    assert code == 0, err
    assert "shown only now" in out and f"{cli.url}/account/team/join/inv_" in out
    listed = json.loads(cli("team", "list", "--json")[1])
    assert listed["you"]["role"] == "owner" and [m["username"] for m in listed["members"]] == ["alice", "bob"]
    assert [i["email"] for i in listed["invitations"]] == ["carol@example.org"]

    code, out, _ = cli("team", "role", "bob", "read_only")
    assert code == 0 and "bob is now read_only" in out
    assert Membership.objects.get(member=other_customer).role == Role.READ_ONLY
    code, _out, err = cli("team", "role", "alice", "billing")
    assert code == errors.BY_STATUS[409] and "always an owner" in err
    assert cli("team", "withdraw", str(Invitation.objects.get().pk))[0] == 0
    assert Invitation.objects.get().revoked_at is not None
    assert cli("team", "remove", "bob")[0] == 0 and not Membership.objects.exists()
    assert cli("team", "rm", "nobody")[0] == errors.NOT_FOUND
    # a token of a member whose role lacks the right: refused with the role named
    Membership.objects.create(account=customer, member=other_customer, role=Role.DEVELOPER,
                              created_at=timezone.now())
    dev = api_token_create(customer=customer, member=other_customer, name="d", scopes=["read", "manage"])[1]
    assert cli("login", "--url", cli.url, "--token-stdin", stdin=dev + "\n")[0] == 0
    code, out, _ = cli("whoami")
    assert code == 0 and out.startswith("bob for alice (developer)")
    code, _out, err = cli("team", "invite", "x@example.org", "owner")
    assert code == errors.BY_STATUS[403] and "developer" in err
