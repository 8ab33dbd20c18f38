"""The workbench commands: copying files, a lease's image, variables, secrets and ports, and the
account's registry credentials and variables."""
import getpass
import os
import sys

from . import transfer
from .client import Api
from .errors import NOT_FOUND, OK, USAGE, CliError
from .output import emit_json, listing, reply, table


def cmd_cp(api: Api, args) -> int:
    """Files to and from a lease's instance over its SSH, resumable (transfer.py)."""
    return transfer.run(api, args)


def looks_like_image_ref(text: str) -> bool:
    """`--image` names a registry image when it has a registry, a path, a tag or a digest
    (ubuntu:24.04, pytorch/pytorch, ghcr.io/org/x@sha256:…); a bare word is a template's slug."""
    return any(c in text for c in "/:@")


def _assignments(items: list[str], *, secret: bool) -> dict:
    """NAME=value pairs; for a secret, a bare NAME takes the value of that environment
    variable, so it never appears on the command line (shell history, `ps`)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            if not secret:
                raise CliError(USAGE, f"Give {item!r} as NAME=value.")
            if name not in os.environ:
                raise CliError(USAGE, f"--secret {name}: set the environment variable {name} to its value, "
                               f"or give {name}=value.")
            value = os.environ[name]
        out[name] = value
    return out


def _port_specs(items: list[str]) -> list[dict]:
    """8888 or 8888:203.0.113.0/24,2001:db8::/32 → {"port", "allow"} (checked by the server)."""
    out = []
    for item in items:
        port, _colon, allow = item.partition(":")
        if not port.isdigit():
            raise CliError(USAGE, f"Give a port as PORT or PORT:CIDR,CIDR, not {item!r}.")
        out.append({"port": int(port), "allow": [a for a in allow.split(",") if a]})
    return out


def workbench_order_fields(args) -> dict:
    body = {}
    if getattr(args, "registry_credential", None):
        body["registry_credential"] = args.registry_credential
    if getattr(args, "start_command", None) is not None:
        body["start_command"] = args.start_command
    if getattr(args, "env", None):
        body["env"] = _assignments(args.env, secret=False)
    if getattr(args, "secret", None):
        body["secrets"] = _assignments(args.secret, secret=True)
    if getattr(args, "port", None):
        body["ports"] = _port_specs(args.port)
    return body


def _workbench_text(wb: dict) -> None:
    print(f"image    {wb['image_ref'] or wb['image']}"
          + (f" (credential {wb['registry_credential']})" if wb.get("registry_credential") else ""))
    if wb.get("pull"):
        pull = wb["pull"]
        print(f"pulling  {pull['done_bytes']} of {pull['total_bytes'] or '?'} bytes")
    if wb.get("error"):
        print(f"error    {wb['error']['code']}: {wb['error'].get('text') or wb['error'].get('detail', '')}")
    if wb.get("start_command"):
        print(f"command  {wb['start_command']}")
    for name, value in sorted(wb["env"].items()):
        print(f"env      {name}={value}")
    for name in wb["secret_names"]:
        print(f"secret   {name} (value hidden)")
    for port in wb["ports"]:
        address = (wb.get("addresses") or {}).get(str(port["port"]), "not published yet")
        print(f"port     {port['port']} -> {address}  from {', '.join(port['allow'])}")


def _workbench_change(api: Api, args, body: dict) -> int:
    wb = api.patch(f"leases/{args.lease}/workbench", body)
    if args.json:
        emit_json(wb)
    else:
        print(("Changed " + ", ".join(wb["changed"]) + ": the server recreates the container within a minute "
               "(files on the disk are kept).") if wb["changed"] else "Nothing changed.")
    return OK


def cmd_workbench(api: Api, args) -> int:
    """The lease's image, command, variables, secrets (by name) and ports with their addresses."""
    wb = api.get(f"leases/{args.lease}/workbench")
    emit_json(wb) if args.json else _workbench_text(wb)
    return OK


def cmd_env(api: Api, args) -> int:
    if args.env_command == "ls":
        return cmd_workbench(api, args)
    if args.env_command == "set":
        return _workbench_change(api, args, {"env": _assignments(args.pairs, secret=False)})
    if args.env_command == "command":
        return _workbench_change(api, args, {"start_command": args.start_command})
    return _workbench_change(api, args, {"env": {name: None for name in args.names}})


def cmd_secrets(api: Api, args) -> int:
    if args.secrets_command == "ls":
        wb = api.get(f"leases/{args.lease}/workbench")
        emit_json({"secret_names": wb["secret_names"]}) if args.json else print("\n".join(wb["secret_names"]))
        return OK
    if args.secrets_command == "set":
        return _workbench_change(api, args, {"secrets": _assignments(args.pairs, secret=True)})
    return _workbench_change(api, args, {"secrets": {name: None for name in args.names}})


def cmd_ports(api: Api, args) -> int:
    if args.ports_command == "ls":
        return cmd_workbench(api, args)
    current = api.get(f"leases/{args.lease}/workbench")["ports"]
    if args.ports_command == "set":
        ports = _port_specs(args.specs)
    elif args.ports_command == "add":
        added = _port_specs(args.specs)
        ports = [p for p in current if p["port"] not in {a["port"] for a in added}] + added
    else:
        ports = [p for p in current if p["port"] not in set(args.ports)]
    return _workbench_change(api, args, {"ports": ports})


def cmd_registry(api: Api, args) -> int:
    if args.registry_command in (None, "ls"):
        return listing(api, args, "registry-credentials", [("id", "ID"), ("name", "NAME"), ("server", "REGISTRY"),
                                                            ("username", "USER"), ("updated_at", "UPDATED")],
                        key="registry_credentials")
    if args.registry_command == "add":
        if args.password_stdin or not sys.stdin.isatty():
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass(f"Password or token for {args.username}@{args.server}: ")
        row = api.post("registry-credentials", {"name": args.name, "server": args.server, "username": args.username,
                                                "password": password})
        return reply(args, row, f"Saved registry credential {row['name']} ({row['username']}@{row['server']}).")
    rows = api.get("registry-credentials")["registry_credentials"]
    match = [r for r in rows if r["name"] == args.credential or str(r["id"]) == args.credential]
    if not match:
        raise CliError(NOT_FOUND, f"No registry credential {args.credential!r}; see `gpu-rent registry ls`.")
    return reply(args, api.delete(f"registry-credentials/{match[0]['id']}"),
                 f"Deleted registry credential {match[0]['name']}.")


def cmd_vars(api: Api, args) -> int:
    if args.vars_command in (None, "ls"):
        rows = api.get("account/variables")["variables"]
        if args.json:
            emit_json({"variables": rows})
        else:
            table([{**r, "value": "(secret, hidden)" if r["secret"] else r["value"]} for r in rows],
                  [("name", "NAME"), ("value", "VALUE"), ("updated_at", "UPDATED")])
        return OK
    if args.vars_command == "set":
        values = _assignments([args.pair], secret=args.secret)
        (name, value), = values.items()
        row = api.post("account/variables", {"name": name, "value": value, "secret": args.secret})
        return reply(args, row, f"Saved {row['name']}{' (secret)' if row['secret'] else ''}: leases you order "
                                "from now on get it.")
    return reply(args, api.delete(f"account/variables/{args.name}"), f"Deleted {args.name}.")
