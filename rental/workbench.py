"""The customer's workbench (docs/adr/0018-secrets-at-rest.md): which image a lease runs (an
operator template, or the customer's own registry reference with an optional registry
credential), its start command, environment variables, secrets and published ports; and
what an account keeps for its leases (registry credentials, account variables and secrets).

Validation (rental.workbench_rules) is shared by the order page, the lease and account pages, the API and the
CLI (through the API): every refusal is a `Problem` with a field, a stable code and a message
for the customer. Every limit is a WORKBENCH_* setting (storefront/settings/workbench.py).

Secrets (lease secrets, account secrets, registry passwords) are sealed at rest with
core.sealing and never leave this module unsealed except into the desired state of the
node that runs the lease (fleet.desired via `lease_node_env` / `lease_registry_auth`). Audit
rows and webhook payloads carry names only, never values."""
import secrets as random_secrets
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from core.sealing import seal, unseal
from inventory.audit import audit_record

from .events import event_record
from .models import LIVE_STATES, AccountVariable, Image, Lease, RegistryCredential
from .workbench_rules import (
    DOMAIN_RE,
    Problem,
    WorkbenchRefused,
    _utf8_len,
    clean_ports,
    env_name_problems,
    env_value_problems,
    image_ref_problems,
    registry_of,
    same_registry,
    start_command_problems,
    totals_problems,
    variables_problems,
)

# --- the workbench of an order -----------------------------------------------------------

@dataclass
class Workbench:
    """What a new lease starts with, checked: image, credential, command, variables, secrets
    (plain here, sealed when stored), ports. `generated`: the template's secrets made for this
    lease (shown to the customer once)."""
    image_ref: str = ""
    registry_credential: RegistryCredential | None = None
    start_command: str = ""
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    ports: list[dict] = field(default_factory=list)
    generated: dict[str, str] = field(default_factory=dict)


def credential_of(customer, name_or_id) -> RegistryCredential | None:
    if name_or_id in (None, ""):
        return None
    rows = RegistryCredential.objects.filter(customer=customer)
    if isinstance(name_or_id, int) or (isinstance(name_or_id, str) and name_or_id.isdigit()):
        return rows.filter(pk=int(name_or_id)).first() or rows.filter(name=str(name_or_id)).first()
    return rows.filter(name=name_or_id).first() if isinstance(name_or_id, str) else None


def workbench_for_order(*, customer, image: Image, image_ref: str = "", registry_credential=None,
                        start_command: str | None = None, env: dict | None = None, secrets: dict | None = None,
                        ports: list | None = None, extra_problems=()) -> Workbench:
    """The checked workbench of a new lease of `image` (the template). With no image of the
    customer's own, the template's start command, ports and variables are the defaults (the
    customer's values of the same name win); with one, only what the customer gives applies.
    The account's variables and secrets are added (the lease's own of the same name win). A
    template's generated secret is made here unless the customer gives its value.
    `extra_problems`: the caller's own (a page's text that did not parse), refused together."""
    problems: list[Problem] = []
    image_ref = (image_ref or "").strip()
    if image_ref:
        problems += image_ref_problems(image_ref)
    credential = None
    if registry_credential not in (None, ""):
        credential = registry_credential if isinstance(registry_credential, RegistryCredential) \
            and registry_credential.customer_id == customer.pk else credential_of(customer, registry_credential)
        if credential is None:
            problems.append(Problem("registry_credential", "registry_credential_unknown", _(
                "No registry credential “%(name)s” in your account.") % {"name": str(registry_credential)[:60]}))
        elif not image_ref:
            problems.append(Problem("registry_credential", "registry_credential_without_image", _(
                "A registry credential is only used with an image of your own: name the image too.")))
        elif not problems and not same_registry(registry_of(image_ref), credential.server):
            problems.append(Problem("registry_credential", "registry_mismatch", _(
                "The credential “%(name)s” is for %(server)s, but the image is pulled from %(registry)s.")
                % {"name": credential.name, "server": credential.server, "registry": registry_of(image_ref)}))
    own_image = bool(image_ref)
    command = start_command if start_command is not None else ("" if own_image else image.start_command)
    problems += start_command_problems(command)
    env, secrets = ({} if env is None else env), ({} if secrets is None else secrets)
    problems += variables_problems(env, "env") + variables_problems(secrets, "secrets")
    port_items = ports if ports is not None else ([] if own_image else [{"port": p} for p in image.ports])
    clean, port_problems = clean_ports(port_items)
    problems += port_problems
    problems = list(extra_problems) + problems
    if problems:
        raise WorkbenchRefused(problems)
    # The account's first, then the template's, then the order's own: the later wins.
    account_env, account_secrets = account_values(customer)
    template_env = {} if own_image else dict(image.env or {})
    merged_env = {**account_env, **template_env, **env}
    merged_secrets = {**account_secrets, **secrets}
    for name in merged_secrets:
        merged_env.pop(name, None)      # a secret of that name wins over a variable
    for name in env:
        if name in account_secrets and name not in secrets:
            merged_secrets.pop(name)    # the order's plain value wins over the account's secret
    generated = {}
    if not own_image and image.generated_secret and image.generated_secret not in merged_secrets:
        value = random_secrets.token_urlsafe(settings.WORKBENCH_GENERATED_SECRET_BYTES)
        generated[image.generated_secret] = merged_secrets[image.generated_secret] = value
        merged_env.pop(image.generated_secret, None)
    totals = totals_problems(merged_env, merged_secrets)
    if totals:
        raise WorkbenchRefused(totals)
    return Workbench(image_ref=image_ref, registry_credential=credential, start_command=command, env=merged_env,
                     secrets=merged_secrets, ports=clean, generated=generated)


def account_values(customer) -> tuple[dict[str, str], dict[str, str]]:
    """The account's variables and (unsealed) secrets, for a new order."""
    env, secrets = {}, {}
    for row in AccountVariable.objects.filter(customer=customer):
        if row.secret:
            secrets[row.name] = unseal(row.sealed_value)["value"]
        else:
            env[row.name] = row.value
    return env, secrets


def _sealed(secrets: dict[str, str]) -> str:
    return seal(secrets) if secrets else ""


def lease_workbench_init(*, lease: Lease, workbench: Workbench, now: datetime, actor=None) -> None:
    """Store a new lease's workbench (in the order's transaction) and audit it: names only.
    An order with none (the template's image as it is) writes nothing, as before."""
    if workbench == Workbench():
        return
    Lease.objects.filter(pk=lease.pk).update(
        image_ref=workbench.image_ref, registry_credential=workbench.registry_credential,
        start_command=workbench.start_command, env=workbench.env, sealed_secrets=_sealed(workbench.secrets),
        secret_names=sorted(workbench.secrets), ports=workbench.ports)
    lease.refresh_from_db()
    event_record(lease.pk, kind="workbench_set", now=now, actor=actor, from_state=lease.state,
                 to_state=lease.state, reason="image, variables, secrets and ports chosen with the order",
                 data=workbench_summary(lease))


def workbench_summary(lease: Lease) -> dict:
    """What audit rows and webhooks say of a lease's workbench: never a value of a variable
    or a secret (a plain variable may hold what the customer thinks of as secret too)."""
    return {"image_ref": lease.image_ref, "image": lease.image.slug if lease.image_id else "",
            "registry_credential": lease.registry_credential.name if lease.registry_credential_id else None,
            "start_command_set": bool(lease.start_command), "env_names": sorted(lease.env),
            "secret_names": sorted(lease.secret_names), "ports": lease.ports}


def workbench_json(lease: Lease) -> dict:
    """A lease's workbench: secrets by name only."""
    return {"image": lease.image.slug, "image_ref": effective_image_ref(lease) or None,
            "own_image": bool(lease.image_ref),
            "registry_credential": lease.registry_credential.name if lease.registry_credential_id else None,
            "start_command": lease.start_command, "env": dict(lease.env), "secret_names": list(lease.secret_names),
            "ports": [{"port": p["port"], "allow": list(p["allow"])} for p in lease.ports]}


def lease_secrets(lease: Lease) -> dict[str, str]:
    return unseal(lease.sealed_secrets) if lease.sealed_secrets else {}


def effective_image_ref(lease: Lease) -> str:
    """The reference the node pulls: the customer's own, else the template's ("" : the node
    maps the template's slug through its own list)."""
    return lease.image_ref or lease.image.image_ref


# --- what only the node running the lease is told ------------------------------------------

def lease_node_env(lease: Lease) -> dict[str, str]:
    """Variables and unsealed secrets merged (secrets win): only for the desired state of the
    node that runs the lease."""
    return {**lease.env, **lease_secrets(lease)}


def lease_registry_auth(lease: Lease) -> dict | None:
    credential = lease.registry_credential
    if credential is None or not lease.image_ref:
        return None
    return {"server": credential.server, "username": credential.username,
            "password": unseal(credential.sealed_password)["password"]}


# --- changing a lease's workbench -------------------------------------------------------------

class WorkbenchChangeRefused(Exception):
    """The lease cannot be changed now (ended); the message says why."""


UNSET = object()


def lease_workbench_change(*, lease_id: int, customer, now: datetime, env: dict | None = None,
                           secrets: dict | None = None, ports=UNSET, start_command=UNSET) -> dict:
    """Change a live lease's variables, secrets, ports or start command. `env` and `secrets`
    are patches ({name: value} sets, {name: None} removes); `ports` replaces the list. The
    node recreates the instance's container with the change (its disk is kept). Audited as a
    `workbench_changed` LeaseEvent with names only; returns what changed (names)."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update(of=("self",)).select_related("image", "registry_credential").get(
            pk=lease_id, customer=customer)
        if lease.state not in LIVE_STATES:
            raise WorkbenchChangeRefused(_("Lease #%(id)s is %(state)s: its workbench cannot be changed.")
                                         % {"id": lease.pk, "state": lease.get_state_display()})
        problems = []
        new_env, new_secrets = dict(lease.env), lease_secrets(lease)
        for where, patch, target in (("env", env, new_env), ("secrets", secrets, new_secrets)):
            if patch is None:
                continue
            if not isinstance(patch, dict):
                problems.append(Problem(where, "env_invalid", _("Give the changes as NAME: value (null removes).")))
                continue
            for name, value in patch.items():
                if value is None:
                    target.pop(name, None)
                    continue
                problems += env_name_problems(name, where) or env_value_problems(name, value, where)
                target[name] = value
        for name in (secrets or {}):
            if isinstance(secrets, dict) and secrets[name] is not None and name not in (env or {}):
                new_env.pop(name, None)     # setting a secret of a variable's name replaces it
        for name in (env or {}):
            if isinstance(env, dict) and env[name] is not None and name not in (secrets or {}):
                new_secrets.pop(name, None)
        new_ports = lease.ports
        if ports is not UNSET:
            new_ports, port_problems = clean_ports(ports)
            problems += port_problems
        new_command = lease.start_command
        if start_command is not UNSET:
            problems += start_command_problems(start_command)
            new_command = start_command if isinstance(start_command, str) else new_command
        if not problems:
            problems += totals_problems(new_env, new_secrets)
        if problems:
            raise WorkbenchRefused(problems)
        changed = []
        if new_env != lease.env:
            changed.append("env")
        if new_secrets != lease_secrets(lease):
            changed.append("secrets")
        if new_ports != lease.ports:
            changed.append("ports")
        if new_command != lease.start_command:
            changed.append("start_command")
        if not changed:
            return {"changed": []}
        Lease.objects.filter(pk=lease.pk).update(
            env=new_env, sealed_secrets=_sealed(new_secrets), secret_names=sorted(new_secrets), ports=new_ports,
            start_command=new_command)
        lease.refresh_from_db()
        summary = {"changed": changed, **workbench_summary(lease)}
        event_record(lease.pk, kind="workbench_changed", now=now, actor=customer, from_state=lease.state,
                     to_state=lease.state, reason="changed by the customer", data=summary)  # what changed: data["changed"]
        _emit_changed(lease, summary, now)
        return summary


def _emit_changed(lease: Lease, summary: dict, now: datetime) -> None:
    """The `lease.workbench_changed` webhook: names only (rental.notifications)."""
    from .notifications.services import lease_event_emit

    lease_event_emit(event="lease.workbench_changed", lease=lease, at=now, now=now, workbench=summary)


# --- the account's registry credentials and variables --------------------------------------------

def registry_credential_save(*, customer, name: str, server: str, username: str, password: str,
                             now: datetime) -> RegistryCredential:
    """Add a credential, or replace the one of that name (its leases pull with the new one
    from their next pull on)."""
    problems = []
    name, server, username = (name or "").strip(), (server or "").strip().lower(), (username or "").strip()
    if not name or len(name) > 60:
        problems.append(Problem("name", "name_invalid", _("Give the credential a name of at most 60 characters.")))
    for prefix in ("https://", "http://"):
        server = server.removeprefix(prefix)
    server = server.rstrip("/")
    if not DOMAIN_RE.match(server) or len(server) > 255:
        problems.append(Problem("server", "registry_server_invalid", _(
            "Give the registry's host name, e.g. ghcr.io or registry.example:5000.")))
    if not username or len(username) > 255 or any(c.isspace() for c in username):
        problems.append(Problem("username", "registry_username_invalid", _("Give the registry user name.")))
    if not isinstance(password, str) or not password or "\x00" in password or \
            _utf8_len(password) > settings.WORKBENCH_MAX_REGISTRY_PASSWORD_BYTES:
        problems.append(Problem("password", "registry_password_invalid", _(
            "Give the password or access token (at most %(n)d bytes).")
            % {"n": settings.WORKBENCH_MAX_REGISTRY_PASSWORD_BYTES}))
    if problems:
        raise WorkbenchRefused(problems)
    with transaction.atomic():
        rows = RegistryCredential.objects.select_for_update().filter(customer=customer)
        row = rows.filter(name=name).first()
        if row is None and rows.count() >= settings.WORKBENCH_MAX_REGISTRY_CREDENTIALS:
            raise WorkbenchRefused([Problem("name", "registry_credentials_too_many", _(
                "At most %(n)d registry credentials per account: delete one first.")
                % {"n": settings.WORKBENCH_MAX_REGISTRY_CREDENTIALS})])
        values = {"server": server, "username": username, "sealed_password": seal({"password": password}),
                  "updated_at": now}
        if row is None:
            row = RegistryCredential.objects.create(customer=customer, name=name, created_at=now, **values)
        else:
            RegistryCredential.objects.filter(pk=row.pk).update(**values)
            row.refresh_from_db()
        audit_record(actor=customer, action="registry_credential_saved", obj=row, at=now,
                     detail={"name": name, "server": server, "username": username})
        return row


def registry_credential_delete(*, customer, credential_id: int, now: datetime) -> bool:
    """False when it is not the customer's; refused while a live lease pulls with it."""
    with transaction.atomic():
        row = RegistryCredential.objects.select_for_update().filter(customer=customer, pk=credential_id).first()
        if row is None:
            return False
        using = list(row.leases.filter(state__in=LIVE_STATES).values_list("pk", flat=True)[:5])
        if using:
            raise WorkbenchRefused([Problem("registry_credential", "registry_credential_in_use", _(
                "Lease %(ids)s pulls with “%(name)s”: it can be deleted once that lease has ended.")
                % {"ids": ", ".join(f"#{i}" for i in using), "name": row.name})])
        audit_record(actor=customer, action="registry_credential_deleted", obj=row, at=now,
                     detail={"name": row.name, "server": row.server})
        # Ended leases keep no reference (the credential's password goes with the row).
        Lease.objects.filter(registry_credential=row).update(registry_credential=None)
        row.delete()
        return True


def account_variable_set(*, customer, name: str, value: str, secret: bool, now: datetime) -> AccountVariable:
    """Add or replace an account variable or secret (used by leases ordered from now on)."""
    name = (name or "").strip()
    problems = env_name_problems(name, "name") or env_value_problems(name, value, "value")
    if problems:
        raise WorkbenchRefused(problems)
    with transaction.atomic():
        rows = AccountVariable.objects.select_for_update().filter(customer=customer)
        row = rows.filter(name=name).first()
        env, secrets = account_values(customer)
        env.pop(name, None)
        secrets.pop(name, None)
        (secrets if secret else env)[name] = value
        totals = totals_problems(env, secrets, where="value")
        if row is None and rows.count() >= settings.WORKBENCH_MAX_ACCOUNT_VARIABLES:
            totals.insert(0, Problem("name", "account_variables_too_many", _(
                "At most %(n)d account variables and secrets: delete one first.")
                % {"n": settings.WORKBENCH_MAX_ACCOUNT_VARIABLES}))
        if totals:
            raise WorkbenchRefused(totals)
        values = {"secret": secret, "value": "" if secret else value,
                  "sealed_value": seal({"value": value}) if secret else "", "updated_at": now}
        try:
            if row is None:
                row = AccountVariable.objects.create(customer=customer, name=name, created_at=now, **values)
            else:
                AccountVariable.objects.filter(pk=row.pk).update(**values)
                row.refresh_from_db()
        except IntegrityError as exc:       # a concurrent first save of that name
            raise WorkbenchRefused([Problem("name", "name_taken", _("%(name)s was just saved: try again.")
                                            % {"name": name})]) from exc
        audit_record(actor=customer, action="account_variable_saved", obj=row, at=now,
                     detail={"name": name, "secret": secret})
        return row


def account_variable_delete(*, customer, variable_id: int, now: datetime) -> bool:
    with transaction.atomic():
        row = AccountVariable.objects.filter(customer=customer, pk=variable_id).first()
        if row is None:
            return False
        audit_record(actor=customer, action="account_variable_deleted", obj=row, at=now,
                     detail={"name": row.name, "secret": row.secret})
        row.delete()
        return True
