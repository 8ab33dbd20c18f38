"""One action, every channel: every form and button a customer's pages post to has an API
route and a `gpu-rent` command (the same services underneath), or is a deliberate exception
listed here with its reason. The actions are found in the templates, so a new form without
an API route and a command fails this test; the OpenAPI schema and cli/README.md are
checked against the routes and the commands."""
import re
import sys
from pathlib import Path

import pytest

from rental.api_schema import build_schema
from storefront.api_routes import api_routes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "cli"))

from gpu_rent.main import build_parser  # noqa: E402

#: page action (the URL name a form posts to, or the template of a form that posts to its own
#: page) → (the API's "METHOD route", the `gpu-rent` commands)
CHANNELS = {
    "order": ("POST api/v1/orders", ["create"]),
    "billing:lease_extend": ("POST api/v1/leases/<int:lease_id>/extend", ["extend"]),
    "lease_auto_renew": ("POST api/v1/leases/<int:lease_id>/auto-renew", ["auto-renew"]),
    "billing:lease_refund": ("POST api/v1/leases/<int:lease_id>/refund", ["refund"]),
    "instance_action": ("POST api/v1/leases/<int:lease_id>/<str:action>", ["restart", "stop", "start"]),
    "instance_restore": ("POST api/v1/leases/<int:lease_id>/restore", ["restore"]),
    "billing:invoice_pay": ("POST api/v1/invoices/<int:invoice_id>/pay", ["pay"]),
    "billing:balance": ("POST api/v1/account/top-up", ["top-up"]),
    "payments:invoice": ("POST api/v1/invoices/<int:invoice_id>/quote", ["quote"]),
    "payments:confirm_late": ("POST api/v1/quotes/<int:quote_id>/confirm-late", ["confirm-late"]),
    "storage_mine:volume_create": ("POST api/v1/volumes", ["volumes create"]),
    "storage_mine:volume_attach": ("POST api/v1/volumes/<int:volume_id>/attach", ["volumes attach"]),
    "storage_mine:volume_detach": ("POST api/v1/volumes/<int:volume_id>/detach", ["volumes detach"]),
    "storage_mine:volume_grow": ("POST api/v1/volumes/<int:volume_id>/grow", ["volumes grow"]),
    "storage_mine:volume_delete": ("DELETE api/v1/volumes/<int:volume_id>", ["volumes rm"]),
    "storage_mine:snapshot_create": ("POST api/v1/snapshots", ["snapshots take"]),
    "storage_mine:snapshot_delete": ("DELETE api/v1/snapshots/<int:snapshot_id>", ["snapshots rm"]),
    "storage_mine:s3_open": ("POST api/v1/object-storage", ["s3 open"]),
    "storage_mine:s3_key_new": ("POST api/v1/object-storage/<int:account_id>/keys", ["s3 key-new"]),
    "storage_mine:s3_key_rotate": ("POST api/v1/object-storage/keys/<int:key_id>/rotate", ["s3 key-rotate"]),
    "storage_mine:s3_key_revoke": ("DELETE api/v1/object-storage/keys/<int:key_id>", ["s3 key-revoke"]),
    "ssh_key_create": ("POST api/v1/keys", ["keys add"]),
    "ssh_key_delete": ("DELETE api/v1/keys/<int:key_id>", ["keys rm"]),
    "webhook_save": ("POST api/v1/webhook", ["webhook set"]),
    "webhook_rotate": ("POST api/v1/webhook/rotate", ["webhook rotate"]),
    "webhook_test": ("POST api/v1/webhook/test", ["webhook test"]),
    "webhook_delete": ("DELETE api/v1/webhook", ["webhook rm"]),
    "webhook_redeliver": ("POST api/v1/webhook/deliveries/<int:delivery_id>/redeliver", ["webhook redeliver"]),
    "billing/sla_claim.html": ("POST api/v1/sla-claims", ["sla claim"]),
    # the workbench (rental.workbench)
    "lease_workbench": ("PATCH api/v1/leases/<int:lease_id>/workbench",
                        ["env set", "env unset", "env command", "secrets set", "secrets unset", "ports set"]),
    "registry_credential_create": ("POST api/v1/registry-credentials", ["registry add"]),
    "registry_credential_delete": ("DELETE api/v1/registry-credentials/<int:credential_id>", ["registry rm"]),
    "account_variable_create": ("POST api/v1/account/variables", ["vars set"]),
    "account_variable_delete": ("DELETE api/v1/account/variables/<str:name>", ["vars rm"]),
    "team_invite": ("POST api/v1/team", ["team invite"]),
    "team_role": ("PATCH api/v1/team/members/<int:member_id>", ["team role"]),
    "team_remove": ("DELETE api/v1/team/members/<int:member_id>", ["team rm"]),
    "team_invitation_revoke": ("DELETE api/v1/team/invitations/<int:invitation_id>", ["team withdraw"]),
}

_SIGN_IN = "signing in and up, passwords and two-factor belong to the browser: a token is made after them"
#: Deliberate exceptions: page actions with no API route or command, and why.
EXCEPTIONS = {
    "logout": "ends the browser's session (the CLI's own `logout` forgets its token)",
    "set_language": "the browser's language choice, a cookie",
    "account_settings": "changes the account's e-mail, where password resets go: a signed-in browser only",
    "token_create": "a token never makes tokens: a leaked one could make itself more",
    "token_revoke": "a token never revokes tokens (the settings page does; a leaked token cannot lock its owner out)",
    "notification_read": "the site's own notice list (the API's customers get events by webhook and e-mail)",
    "notifications_read_all": "the site's own notice list",
    "billing:invoice_pay_demo": "demo store only: marks an invoice paid without money",
    "payments:demo_wallet": "demo store only: a pretend wallet",
    "account_switch": "which account the browser acts for; a token belongs to one account already",
    "team_leave": "leaving a team is the member's own choice in the browser: a token acts within the team",
    "rental/team_join.html": "accepting an invitation needs the invitee signed in: a token of theirs is "
                             "not yet the team's",
    **{f"registration/{name}.html": _SIGN_IN for name in (
        "forgot_password", "login", "password_change_form", "password_reset_confirm", "password_reset_form",
        "recovery_codes_new", "signup")},
    **{f"rental/{name}.html": _SIGN_IN for name in ("otp_disable", "otp_recovery_codes_new", "otp_setup",
                                                    "otp_verify")},
}

FORM = re.compile(r"<form\b[^>]*>", re.S)
URL_NAME = re.compile(r"""(?:action|hx-post)="\{%\s*url\s+'([^']+)'""")


def page_actions() -> set[str]:
    """Every customer page's POST form: the URL name it posts to, or its template when it
    posts to its own page. The operators' pages (templates/admin) are not the customer's."""
    found = set()
    for path in sorted((ROOT / "templates").rglob("*.html")):
        rel = path.relative_to(ROOT / "templates").as_posix()
        if rel.startswith("admin/"):
            continue
        for tag in FORM.findall(path.read_text()):
            if not re.search(r'method="post"', tag, re.I):
                continue
            names = URL_NAME.findall(tag)
            found.update(names or ([rel] if "action=" not in tag else [f"{rel}: {tag}"]))
    return found


def cli_commands() -> set[str]:
    """Every `gpu-rent` command, with its actions ("volumes create")."""
    def subcommands(parser):
        for action in parser._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                return action.choices
        return {}

    found = set()
    for name, sub in subcommands(build_parser()).items():
        found.add(name)
        found.update(f"{name} {action}" for action in subcommands(sub))
    return found


def _api() -> set[str]:
    return {f"{method} {route.route}" for route in api_routes() for method in route.scopes}


def test_every_page_action_has_an_api_route_and_a_command_or_is_a_listed_exception():
    actions = page_actions()
    missing = actions - set(CHANNELS) - set(EXCEPTIONS)
    assert not missing, f"page actions with no API route and CLI command (add them, or an exception): {missing}"
    stale = (set(CHANNELS) | set(EXCEPTIONS)) - actions
    assert not stale, f"listed here but no page posts to them any more: {stale}"
    assert not set(CHANNELS) & set(EXCEPTIONS)
    api, cli = _api(), cli_commands()
    for action, (route, commands) in CHANNELS.items():
        assert route in api, f"{action}: no API route {route}"
        for command in commands:
            assert command in cli, f"{action}: no `gpu-rent {command}`"


def _schema_paths(route: str) -> list[str]:
    path = "/" + re.sub(r"<[^>]+>", "{}", route)
    if route.endswith("<str:action>"):  # the instance actions, one schema path each
        return [path[: -len("{}")] + action for action in ("restart", "stop", "start")]
    return [path]


def test_the_openapi_schema_describes_every_route_and_method():
    schema = {(method.upper(), re.sub(r"\{[^}]+\}", "{}", path)) for path, ops in build_schema()["paths"].items()
              for method in ops}
    for route in api_routes():
        if route.route.endswith("<path:rest>"):  # the JSON 404 for everything else
            continue
        for method in route.scopes:
            for path in _schema_paths(route.route):
                assert (method, path) in schema, f"the schema lacks {method} {path}"


def test_the_cli_readme_shows_every_command():
    readme = (ROOT / "cli" / "README.md").read_text()
    missing = sorted(c for c in cli_commands() if not re.search("`" + re.escape(c) + "[ `]", readme))
    assert not missing, f"cli/README.md does not show: {missing}"


@pytest.mark.parametrize("command", ["offers", "ls", "volumes", "snapshots", "invoices", "sites", "images", "s3",
                                     "sla", "keys ls"])
def test_every_listing_is_a_command(command):
    assert command in cli_commands()
