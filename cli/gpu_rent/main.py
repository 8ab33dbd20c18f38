"""`gpu-rent`: the argument parser and the dispatch; the commands are in commands.py and the
storage, workbench and account_commands.py modules (COMMAND_MODULES)."""
import argparse
import os
import sys

from . import (
    __version__,
    account_commands,
    commands,
    config,
    storage_commands,
    transfer,
    verify,
    workbench_commands,
)
from .client import Api
from .errors import OK, CliError, epilog
from .output import emit_json

SORTS = ("price", "per-gpu-hour", "vram", "free", "name")
TEAM_ROLES = ("owner", "billing", "developer", "read_only")


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: given after the subcommand it counts; not given, the top level's stays.
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("--url", default=argparse.SUPPRESS, help="the storefront's address")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="gpu-rent", description="Rent dedicated GPUs from the command line.",
                                     epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpu-rent {__version__}")
    parser.add_argument("--json", action="store_true", default=False, help="print JSON")
    parser.add_argument("--url", default=None, help="the storefront's address (default: from login)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help_text, **kw):
        return sub.add_parser(name, help=help_text, parents=[common], description=help_text, **kw)

    p = add("login", "store a token (made on the account settings page) for this server")
    p.add_argument("--token-stdin", action="store_true", help="read the token from standard input")
    add("logout", "forget the stored token")
    add("whoami", "the account, the token's scopes and the balance")

    p = add("offers", "offers with prices and free GPUs per site")
    p.add_argument("--gpu", help="GPU model, e.g. 4090 or h100")
    p.add_argument("--gpus", type=int, help="GPUs per offer")
    p.add_argument("--site", "--region", dest="site", help="only offers with free GPUs at this site")
    p.add_argument("--min-vram", type=int, metavar="GB", help="at least this much VRAM per GPU")
    p.add_argument("--vendor", choices=["nvidia", "amd"])
    p.add_argument("--cycle", choices=["week", "month"], default="week", help="price column (default week)")
    p.add_argument("--max-price", type=float, metavar="USD", help="at most this per cycle")
    p.add_argument("--available", action="store_true", help="only offers with free GPUs")
    p.add_argument("--sort", choices=SORTS, default="price")
    p.add_argument("--desc", action="store_true", help="sort descending")

    p = add("estimate", "VRAM and cost for a fine-tuning job (the calculator's inputs)")
    for flag in ("model", "params", "method", "seq", "batch", "gpus", "lora-rank", "lora-targets", "zero",
                 "offload", "tokens", "epochs", "framework", "utilisation"):
        p.add_argument(f"--{flag}")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="any other calculator input")

    p = add("create", "order a GPU server; pays from the balance or prints the invoice")
    p.add_argument("--gpu", help="GPU model, e.g. 4090 (with --gpus: which offer)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs (default 1)")
    p.add_argument("--offer", help="an offer slug instead of --gpu/--gpus")
    p.add_argument("--site", "--region", dest="site", required=True, help="site code, e.g. DFW-1")
    p.add_argument("--image", help="a template's slug (default: the vendor's PyTorch image), or a registry image "
                   "with a path, tag or digest (ubuntu:24.04, ghcr.io/org/name:tag)")
    p.add_argument("--cycle", choices=["week", "month"], required=True)
    p.add_argument("--key", help="name of a saved SSH key (default: the only one saved)")
    p.add_argument("--key-file", help="an SSH public key file instead of a saved key")
    p.add_argument("--pay", choices=["auto", "balance", "invoice"], default="auto",
                   help="auto: from the balance when it covers the order, else an invoice")
    p.add_argument("--coin", help="with an invoice: also print payment details in this coin (e.g. LTC)")
    for addon in ("extra-nvme-tb", "network-volume-tb"):  # snapshots: taken from a running lease
        p.add_argument(f"--{addon}", type=int, default=0)
    _workbench_flags(p)
    _wait_flags(p)

    add("ls", "your leases")
    p = add("show", "one lease with its events")
    p.add_argument("lease", type=int)
    p = add("metrics", "a lease's GPU readings (utilisation, VRAM, temperature, power), GPU errors and egress")
    p.add_argument("lease", type=int)
    p.add_argument("--since", default="24h", help="RFC 3339 time or a span back from now: 90m, 6h, 7d (default 24h)")
    p.add_argument("--until", help="RFC 3339 time or a span back from now (default now)")
    p.add_argument("--resolution", type=int, metavar="MINUTES",
                   help="minutes a row: 1, 5, 10, 15, 30, 60, 360, 1440 (default: 60 for the table, "
                        "the finest the server allows with --json)")
    p = add("wait", "wait until a lease's instance is ready")
    p.add_argument("lease", type=int)
    _wait_flags(p, flag=False)
    p = add("ssh", "connect to a lease's instance with ssh (extra arguments after --)")
    p.add_argument("lease", type=int)
    p.add_argument("ssh_args", nargs=argparse.REMAINDER)
    for action in ("restart", "stop", "start"):
        p = add(action, f"{action} the instance (files on the disk are kept)")
        p.add_argument("lease", type=int)
    p = add("extend", "pay the lease's next term now (from the balance, or an invoice)")
    p.add_argument("lease", type=int)
    p.add_argument("--pay", choices=["auto", "balance", "invoice"], default="auto")
    p.add_argument("--coin", help="with an invoice: also print payment details in this coin")
    p = add("auto-renew", "renew this lease from the balance: on, off, or as the account")
    p.add_argument("lease", type=int)
    p.add_argument("choice", choices=["on", "off", "default"])
    p = add("refund", "cancel a lease within its refund window; what was paid returns to the balance")
    p.add_argument("lease", type=int)
    p.add_argument("--yes", action="store_true", help="do not ask")

    keys = add("keys", "saved SSH keys").add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    p = keys.add_parser("add", help="save a public key", parents=[common])
    p.add_argument("name")
    p.add_argument("file", help="public key file, or - for standard input")
    keys.add_parser("ls", help="list saved keys", parents=[common])
    p = keys.add_parser("rm", help="delete a saved key (running leases keep theirs)", parents=[common])
    p.add_argument("key", help="name or id")

    _workbench_parsers(add, common)
    _account_workbench_parsers(add, common)

    p = add("restore", "replace a stopped lease's disk with one of your snapshots at its site")
    p.add_argument("lease", type=int)
    p.add_argument("snapshot", type=int)

    volumes = add("volumes", "your network volumes (no action: list them)").add_subparsers(
        dest="volumes_command", required=False, metavar="ACTION")
    volumes.add_parser("ls", help="list your volumes", parents=[common])
    p = volumes.add_parser("create", help="order a volume; its first 30 days are paid from the balance",
                           parents=[common])
    p.add_argument("--site", "--region", dest="site", required=True)
    p.add_argument("--size-tb", type=int, required=True)
    p.add_argument("--name", default="data")
    for action, text in (("attach", "attach a volume to a running lease at its site"),
                         ("detach", "detach a volume from a lease")):
        p = volumes.add_parser(action, help=text, parents=[common])
        p.add_argument("volume", type=int)
        p.add_argument("lease", type=int)
    p = volumes.add_parser("grow", help="grow a volume; the extra TB are paid pro rata", parents=[common])
    p.add_argument("volume", type=int)
    p.add_argument("size_tb", type=int, metavar="NEW_SIZE_TB")
    p = volumes.add_parser("rm", help="delete a volume and its data", parents=[common])
    p.add_argument("volume", type=int)
    p.add_argument("--yes", action="store_true", help="do not ask")

    snapshots = add("snapshots", "your snapshots (no action: list them)").add_subparsers(
        dest="snapshots_command", required=False, metavar="ACTION")
    snapshots.add_parser("ls", help="list your snapshots", parents=[common])
    p = snapshots.add_parser("take", help="snapshot a lease's disk; billed for what it stores", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("--size-tb", type=int, default=1, help="the snapshot's quota (default 1)")
    p = snapshots.add_parser("restore", help="replace a stopped lease's disk with the snapshot (as `restore`)",
                             parents=[common])
    p.add_argument("snapshot", type=int)
    p.add_argument("lease", type=int)
    p = snapshots.add_parser("rm", help="delete a snapshot", parents=[common])
    p.add_argument("snapshot", type=int)
    p.add_argument("--yes", action="store_true", help="do not ask")

    s3 = add("s3", "object storage (no action: your accounts and keys)").add_subparsers(
        dest="s3_command", required=False, metavar="ACTION")
    s3.add_parser("ls", help="your object-storage accounts and keys", parents=[common])
    p = s3.add_parser("open", help="open object storage at a site (or change its quota)", parents=[common])
    p.add_argument("--site", "--region", dest="site", required=True)
    p.add_argument("--quota-gb", type=int, default=1000)
    p = s3.add_parser("key-new", help="a new key for an account (the secret is shown once)", parents=[common])
    p.add_argument("account", type=int)
    p = s3.add_parser("key-rotate", help="a new key, then this one revoked (the secret is shown once)",
                      parents=[common])
    p.add_argument("key", type=int)
    p = s3.add_parser("key-revoke", help="revoke a key: it stops working", parents=[common])
    p.add_argument("key", type=int)

    p = add("invoices", "your invoices")
    p.add_argument("--state", choices=["open", "paid", "expired", "void"])
    p = add("quote", "payment details of an open invoice in one coin (address, exact amount)")
    p.add_argument("invoice", type=int)
    p.add_argument("coin", help="e.g. LTC")
    p = add("pay", "pay an open invoice from the balance")
    p.add_argument("invoice", type=int)
    p = add("top-up", "a top-up invoice for the balance, to pay in a coin")
    p.add_argument("amount", help="USD, e.g. 50 or 50.00")
    p.add_argument("--coin", help="also print payment details in this coin (e.g. LTC)")
    sla = add("sla", "SLA claims (no action: yours)").add_subparsers(dest="sla_command", required=False,
                                                                      metavar="ACTION")
    sla.add_parser("ls", help="your SLA claims", parents=[common])
    p = sla.add_parser("claim", help="claim a credit for a lease's downtime in a month", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("month", help="YYYY-MM (UTC)")
    p.add_argument("--message", default="", help="what happened")
    hook = add("webhook", "the account's webhook (no action: show it and its deliveries)").add_subparsers(
        dest="webhook_command", required=False, metavar="ACTION")
    hook.add_parser("show", help="the endpoint and its latest deliveries", parents=[common])
    p = hook.add_parser("set", help="set the URL (a new endpoint's secret is shown once)", parents=[common])
    p.add_argument("url")
    hook.add_parser("rm", help="remove it: no more events are sent", parents=[common])
    hook.add_parser("rotate", help="a new signing secret (shown once)", parents=[common])
    hook.add_parser("test", help="queue a webhook.test event", parents=[common])
    p = hook.add_parser("redeliver", help="queue a delivery again with a new delivery id", parents=[common])
    p.add_argument("delivery", type=int)
    team = add("team", "the account's members and their roles (no action: list them)").add_subparsers(
        dest="team_command", required=False, metavar="ACTION")
    team.add_parser("ls", aliases=["list"], help="members, your role and (owners) pending invitations",
                    parents=[common])
    p = team.add_parser("invite", help="invite an e-mail address in a role (the link is shown once)",
                        parents=[common])
    p.add_argument("email")
    p.add_argument("role", choices=TEAM_ROLES)
    p = team.add_parser("role", help="change a member's role", parents=[common])
    p.add_argument("member", help="username or id")
    p.add_argument("role", choices=TEAM_ROLES)
    p = team.add_parser("withdraw", help="withdraw a pending invitation", parents=[common])
    p.add_argument("invitation", type=int)
    p = team.add_parser("rm", aliases=["remove"], help="remove a member (their access and tokens end at once)",
                        parents=[common])
    p.add_argument("member", help="username or id")
    p = add("confirm-late", "apply a late crypto payment to its order (paid from the credit it made)")
    p.add_argument("quote", type=int)
    add("sites", "the sites one can order at (the codes --site takes)")
    add("images", "the images one can order (the slugs --image takes)")
    verify.add_parser(add)      # offline: no token, no server
    transfer.add_parser(add)    # `cp`: over the lease's SSH
    return parser


def _workbench_flags(p) -> None:
    """An order's own image login, start command, variables, secrets and ports."""
    p.add_argument("--registry-credential", metavar="NAME", help="a saved registry credential for a private image")
    p.add_argument("--start-command", metavar="CMD", help="run with /bin/sh -c beside SSH (default: the template's)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable")
    p.add_argument("--secret", action="append", default=[], metavar="NAME[=VALUE]",
                   help="a secret (stored encrypted, never shown again); NAME alone takes $NAME's value")
    p.add_argument("--port", action="append", default=[], metavar="PORT[:CIDR,...]",
                   help="publish a container port, to anyone or only from these networks")


def _workbench_parsers(add, common) -> None:
    add("workbench", "a lease's image, variables, secrets (names) and ports with their addresses").add_argument(
        "lease", type=int)
    env = add("env", "a lease's environment variables").add_subparsers(dest="env_command", required=True,
                                                                        metavar="ACTION")
    p = env.add_parser("ls", help="variables, secrets (names) and ports", parents=[common])
    p.add_argument("lease", type=int)
    p = env.add_parser("set", help="set variables (the container is recreated, files kept)", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("pairs", nargs="+", metavar="NAME=VALUE")
    p = env.add_parser("unset", help="remove variables", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("names", nargs="+", metavar="NAME")
    p = env.add_parser("command", help="set the start command (\"\" for none)", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("start_command", metavar="CMD")
    secrets = add("secrets", "a lease's secrets (write-only)").add_subparsers(dest="secrets_command", required=True,
                                                                               metavar="ACTION")
    p = secrets.add_parser("ls", help="the secrets' names", parents=[common])
    p.add_argument("lease", type=int)
    p = secrets.add_parser("set", help="set secrets; NAME alone takes $NAME's value", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("pairs", nargs="+", metavar="NAME[=VALUE]")
    p = secrets.add_parser("unset", help="remove secrets", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("names", nargs="+", metavar="NAME")
    ports = add("ports", "a lease's published ports").add_subparsers(dest="ports_command", required=True,
                                                                     metavar="ACTION")
    p = ports.add_parser("ls", help="ports with their public addresses", parents=[common])
    p.add_argument("lease", type=int)
    for action, text in (("set", "replace the list"), ("add", "add or change ports")):
        p = ports.add_parser(action, help=text, parents=[common])
        p.add_argument("lease", type=int)
        p.add_argument("specs", nargs="+", metavar="PORT[:CIDR,...]")
    p = ports.add_parser("rm", help="stop publishing ports", parents=[common])
    p.add_argument("lease", type=int)
    p.add_argument("ports", nargs="+", type=int, metavar="PORT")


def _account_workbench_parsers(add, common) -> None:
    registry = add("registry", "registry credentials for private images (no action: list them)").add_subparsers(
        dest="registry_command", required=False, metavar="ACTION")
    registry.add_parser("ls", help="list them (no passwords)", parents=[common])
    p = registry.add_parser("add", help="save one (the password is asked for, or read from stdin)",
                            parents=[common])
    p.add_argument("name")
    p.add_argument("server", help="e.g. ghcr.io")
    p.add_argument("username")
    p.add_argument("--password-stdin", action="store_true", help="read the password or token from standard input")
    p = registry.add_parser("rm", help="delete one (not while a live lease pulls with it)", parents=[common])
    p.add_argument("credential", help="name or id")
    variables = add("vars", "account variables and secrets added to new orders (no action: list them)")
    variables = variables.add_subparsers(dest="vars_command", required=False, metavar="ACTION")
    variables.add_parser("ls", help="list them (secrets by name)", parents=[common])
    p = variables.add_parser("set", help="set NAME=VALUE (with --secret, NAME alone takes $NAME's value)",
                             parents=[common])
    p.add_argument("pair", metavar="NAME[=VALUE]")
    p.add_argument("--secret", action="store_true", help="store it encrypted, never shown again")
    p = variables.add_parser("rm", help="delete one", parents=[common])
    p.add_argument("name")


def _wait_flags(p, flag: bool = True) -> None:
    if flag:
        p.add_argument("--wait", action="store_true", help="wait until the instance is ready, showing progress")
    p.add_argument("--timeout", type=float, default=1800, metavar="SECONDS", help="give up waiting after this")
    p.add_argument("--poll", type=float, default=5, metavar="SECONDS", help="check this often")


#: where `cmd_<command>` is looked up, in order
COMMAND_MODULES = (commands, storage_commands, workbench_commands, account_commands)


def handler_for(command: str):
    name = "cmd_" + command.replace("-", "_")
    return next(getattr(module, name) for module in COMMAND_MODULES if hasattr(module, name))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stored = config.load()
    url = args.url or stored.get("url", "")
    try:
        if args.command == "login":
            return commands.login(args, url)
        if args.command == "logout":
            return commands.logout(args)
        if args.command == "verify-record":
            return verify.run(args)
        api = Api(url, stored.get("token", "") if url.rstrip("/") == stored.get("url", "").rstrip("/") or
                  not stored.get("url") else "")
        code = handler_for(args.command)(api, args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return code
    except CliError as exc:
        if args.json:
            emit_json(exc.as_json())
        print(f"gpu-rent: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`gpu-rent ls | head`): stop quietly; what is still buffered goes
        # to /dev/null, so the interpreter's own flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return OK


if __name__ == "__main__":
    raise SystemExit(main() or OK)
